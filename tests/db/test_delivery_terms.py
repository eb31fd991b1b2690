"""spec.delivery's headers, TLS and retry limits end to end: real workers
and real receivers on loopback (HTTPS with a test CA and client
certificates where TLS is the point). ``hooklane endpoint apply`` as a
process: tests/processes/test_delivery_terms.py."""

from __future__ import annotations

import json
import logging
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane import tls as tls_contexts
from hooklane.delivery import DeliverySpec, HeaderSpec, SecretKeyRef, TlsSpec
from hooklane.health import as_json
from hooklane.policies import RetryPolicy
from hooklane.spec import EndpointSpec
from hooklane.views import detail_json
from testsupport import certs
from testsupport.delivery_terms import CA, CLIENT, KEYRING, SECRETS, server_context, terms
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.receivers import Answer, OpenSslReceiver, Receiver

FAST_RETRY = RetryPolicy(base_seconds=0.2, cap_seconds=1.0)


API_KEY = "sk_live_7Qm2Zr9Xw4Lp"


API_HEADERS = DeliverySpec(
    headers=(HeaderSpec("X-Api-Key", secret=SecretKeyRef("api", "token")), HeaderSpec("X-Team", "payments"))
)


async def settled(db) -> None:
    await wait_for(lambda: db.fetchval("SELECT bool_and(state IN ('delivered', 'dead')) FROM deliveries"), 30)


async def shown_anywhere(db) -> str:
    """Everything an operator or tenant can read about the endpoints and
    their deliveries: the admin views, and every row but the sealed terms."""
    health = [as_json(h) for h in await store.endpoint_health(db)]
    details = []
    for delivery_id in await db.fetch("SELECT id FROM deliveries"):
        detail = await store.delivery_detail(db, delivery_id["id"])
        assert detail is not None
        details.append(detail_json(detail))
    rows = [
        await db.fetchval(f"SELECT coalesce(json_agg(t), '[]')::text FROM {table} t")
        for table in ("endpoints", "deliveries", "delivery_attempts")
    ]
    return json.dumps([health, details]) + "".join(rows)


async def test_static_and_secret_headers_arrive_and_are_shown_nowhere(db, receiver, start_worker, caplog):
    caplog.set_level(logging.DEBUG)
    # A failed attempt first, so that there is an error, a log line and an
    # attempt row for the value to leak into.
    url = receiver.on("keyed", lambda i: Answer(500) if i == 0 else Answer(204))
    spec = EndpointSpec("default", "keyed", url, "acme", delivery=API_HEADERS)
    resolved = terms(API_HEADERS, {"api": {"token": API_KEY}})
    await store.upsert_endpoint(db, spec, SECRET, terms=resolved, keyring=KEYRING)
    event_id = await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker(retry=FAST_RETRY, encryption_key=KEYRING)
    await settled(db)

    got = receiver.at("keyed")
    assert len(got) == 2
    for request in got:
        assert (request.headers["X-Api-Key"], request.headers["X-Team"]) == (API_KEY, "payments")
        assert Webhook(SECRET).verify(request.body, request.headers)["id"] == event_id
    assert await db.fetchval("SELECT state FROM deliveries") == "delivered"
    assert await db.fetchval("SELECT last_error FROM endpoints") == "HTTP 500"
    # Sealed at rest, like the signing secret: not even the row holds it.
    assert "payments" not in await db.fetchval("SELECT request_terms FROM endpoints")
    for text in (await shown_anywhere(db), caplog.text):
        assert API_KEY not in text
    assert "HTTP 500" in await shown_anywhere(db)


async def first_outcome(db) -> tuple[str, str | None, str | None]:
    """The delivery's state, failure and error after its first attempt."""
    await wait_for(lambda: db.fetchval("SELECT attempts > 0 AND state <> 'sending' FROM deliveries"), 30)
    row = await db.fetchrow("SELECT state, last_failure, last_error FROM deliveries")
    return row["state"], row["last_failure"], row["last_error"]


@pytest.mark.parametrize(
    "tls, outcome",
    [
        (TlsSpec(SecretKeyRef("ca", "ca.crt"), "client"), ("delivered", None, None)),
        # The system's trust store does not know the test CA.
        (TlsSpec(None, "client"), ("pending", "tls_error", "TLS error")),
        (None, ("pending", "tls_error", "TLS error")),
    ],
)
async def test_mutual_tls_with_a_private_ca(db, start_worker, tmp_path, tls, outcome):
    context = server_context(tmp_path, certs.server(CA), clients_of=CA)
    async with Receiver(ssl_context=context) as receiver:
        url = receiver.on("mtls", Answer(204))
        assert url.startswith("https://127.0.0.1:")
        delivery = DeliverySpec(tls=tls)
        await add_endpoint(db, "mtls", url, delivery=delivery, terms=terms(delivery, SECRETS))
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        start_worker()
        assert await first_outcome(db) == outcome
        assert len(receiver.at("mtls")) == (1 if outcome[0] == "delivered" else 0)


@pytest.fixture
def hashed_trust(tmp_path, monkeypatch) -> Iterator[Path]:
    """The system's trust store, as OpenSSL finds it (SSL_CERT_DIR): a
    hashed directory holding only the test CA, named as c_rehash names it."""
    trust = tmp_path / "trust"
    trust.mkdir()
    subject_hash = subprocess.run(
        ["openssl", "x509", "-noout", "-subject_hash"],
        input=CA.pem,
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    (trust / f"{subject_hash}.0").write_text(CA.pem)
    monkeypatch.setenv("SSL_CERT_DIR", str(trust))
    monkeypatch.delenv("SSL_CERT_FILE", raising=False)
    tls_contexts.hashed_directory.cache_clear()
    yield trust
    tls_contexts.hashed_directory.cache_clear()


async def test_a_client_certificate_trusts_the_system_store_looked_up_not_loaded(
    db, start_worker, tmp_path, hashed_trust
):
    # Each endpoint with a client certificate has a context of its own: one
    # that held the whole system bundle would cost every such endpoint
    # hundreds of KiB. Nothing is loaded until a handshake looks its CA up.
    context = tls_contexts.client_context(None, CLIENT.cert, CLIENT.key)
    assert context is not None and context.cert_store_stats()["x509_ca"] == 0
    # A bundle named by SSL_CERT_FILE is what the operator chose to trust:
    # only the file says what, so it is loaded.
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SSL_CERT_FILE", str(next(hashed_trust.iterdir())))
        tls_contexts.hashed_directory.cache_clear()
        context = tls_contexts.client_context(None, CLIENT.cert, CLIENT.key)
        assert context is not None and context.cert_store_stats()["x509_ca"] == 1
    tls_contexts.hashed_directory.cache_clear()
    server = server_context(tmp_path, certs.server(CA), clients_of=CA)
    async with Receiver(ssl_context=server) as receiver:
        delivery = DeliverySpec(tls=TlsSpec(None, "client"))
        url = receiver.on("mtls", Answer(204))
        await add_endpoint(db, "mtls", url, delivery=delivery, terms=terms(delivery, SECRETS))
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        start_worker()
        assert await first_outcome(db) == ("delivered", None, None)


@pytest.mark.parametrize(
    "tls, outcome, refused",
    [
        (TlsSpec(SecretKeyRef("ca", "ca.crt"), "client"), ("delivered", None, None), []),
        # Trusted, but refused by the receiver for want of a certificate:
        # with TLS 1.3 the refusal comes after the sender's handshake is done.
        (
            TlsSpec(SecretKeyRef("ca", "ca.crt")),
            ("pending", "tls_error", "TLS error"),
            ["PEER_DID_NOT_RETURN_A_CERTIFICATE"],
        ),
    ],
)
async def test_a_client_certificate_refused_by_the_receiver_is_a_tls_error(
    db, start_worker, tmp_path, tls, outcome, refused
):
    with OpenSslReceiver(server_context(tmp_path, certs.server(CA), clients_of=CA)) as receiver:
        delivery = DeliverySpec(tls=tls)
        await add_endpoint(
            db, "mtls", receiver.url("mtls"), delivery=delivery, terms=terms(delivery, SECRETS)
        )
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        start_worker()
        assert await first_outcome(db) == outcome
        # Its thread records a refusal after sending the alert.
        await wait_for(lambda: len(receiver.refused) == len(refused))
        assert receiver.refused == refused
        assert len(receiver.heads) == (1 if outcome[0] == "delivered" else 0)


@pytest.mark.parametrize(
    "server_name, outcome",
    [("receiver.test", ("delivered", None, None)), (None, ("pending", "tls_error", "TLS error"))],
)
async def test_server_name_is_the_name_verified(db, start_worker, tmp_path, server_name, outcome):
    named = CA.issue("receiver.test", dns=("receiver.test",))
    async with Receiver(ssl_context=server_context(tmp_path, named, clients_of=None)) as receiver:
        delivery = DeliverySpec(tls=TlsSpec(SecretKeyRef("ca", "ca.crt"), None, server_name))
        url = receiver.on("named", Answer(204))
        await add_endpoint(db, "named", url, delivery=delivery, terms=terms(delivery, SECRETS))
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        start_worker()
        assert await first_outcome(db) == outcome


async def test_max_attempts_of_the_endpoint_makes_a_delivery_dead_after_that_many(db, receiver, start_worker):
    # 500 until the delivery is dead, then 204 for the next event: a fourth
    # attempt at the first would arrive before that one's.
    url = receiver.on("limited", lambda i: Answer(500) if i < 3 else Answer(204))
    await add_endpoint(db, "limited", url, delivery=DeliverySpec(max_attempts=3))
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="evt-dead")
    start_worker(retry=FAST_RETRY)
    await wait_for(lambda: db.fetchval("SELECT state = 'dead' FROM deliveries"), 30)
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="evt-later")
    await settled(db)
    row = await db.fetchrow("SELECT attempts, last_error FROM deliveries WHERE event_id = 'evt-dead'")
    assert tuple(row) == (3, "HTTP 500; gave up after 3 attempts")
    assert [json.loads(r.body)["id"] for r in receiver.at("limited")] == ["evt-dead"] * 3 + ["evt-later"]
    outcomes = await db.fetch(
        "SELECT outcome FROM delivery_attempts WHERE event_id = 'evt-dead' ORDER BY attempt"
    )
    assert [r["outcome"] for r in outcomes] == ["retry", "retry", "dead"]


async def test_max_age_of_the_endpoint_makes_an_old_delivery_dead(db, receiver, start_worker):
    url = receiver.on("aged", Answer(500))
    aged = await add_endpoint(db, "aged", url, delivery=DeliverySpec(max_age_seconds=1.0))
    # The same receiver without the endpoint's limit: still retried at that age.
    unlimited = await add_endpoint(db, "unlimited", receiver.on("unlimited", Answer(500)))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker(retry=FAST_RETRY)
    await wait_for(
        lambda: db.fetchval("SELECT state = 'dead' FROM deliveries WHERE endpoint_id = $1", aged), 30
    )
    # Past the point where the default limits would have ended it too: an
    # attempt of the other delivery made after it was 2 s old.
    await wait_for(
        lambda: db.fetchval(
            "SELECT bool_or(a.started_at > d.created_at + interval '2 seconds')"
            " FROM delivery_attempts a JOIN deliveries d ON d.id = a.delivery_id WHERE d.endpoint_id = $1",
            unlimited,
        ),
        30,
    )
    dead = await db.fetchrow("SELECT attempts, last_error FROM deliveries WHERE endpoint_id = $1", aged)
    assert dead["attempts"] < 20
    assert re.fullmatch(r"HTTP 500; gave up at age [1-9][0-9]? s", dead["last_error"]), dead["last_error"]
    assert await db.fetchval("SELECT state FROM deliveries WHERE endpoint_id = $1", unlimited) in (
        "pending",
        "sending",
    )


async def test_a_resent_delivery_gets_its_whole_max_age_and_keeps_its_creation(db, receiver, start_worker):
    """Made two hours ago and dead, on an endpoint whose max age is one
    hour: resent, it is retried (its age counts from the resend) until
    delivered, and is still shown created two hours ago."""
    answers = (Answer(413), Answer(500), Answer(204))
    url = receiver.on("aged", lambda i: answers[min(i, 2)])
    await add_endpoint(db, "aged", url, delivery=DeliverySpec(max_age_seconds=3600.0))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker(retry=FAST_RETRY)
    await wait_for(lambda: db.fetchval("SELECT state = 'dead' FROM deliveries"), 30)
    made = await db.fetchval(
        "UPDATE deliveries SET created_at = now() - interval '2 hours' RETURNING created_at"
    )

    assert await store.resend_dead(db, "default", "aged") == 1
    resent = await db.fetchval("SELECT created_at FROM deliveries")
    await wait_for(lambda: db.fetchval("SELECT state IN ('delivered', 'dead') FROM deliveries"), 30)
    outcomes = await db.fetch("SELECT outcome, status, error FROM delivery_attempts ORDER BY recorded_at")
    assert [tuple(r) for r in outcomes] == [
        ("dead", 413, "HTTP 413: payload too large for the receiver"),
        ("retry", 500, "HTTP 500"),
        ("delivered", 204, None),
    ]
    detail = await store.delivery_detail(db, await db.fetchval("SELECT id FROM deliveries"))
    assert detail is not None
    assert (detail.delivery.created_at, detail.delivery.queued_at) == (made, resent)
    assert detail.delivery.queued_again_at == resent

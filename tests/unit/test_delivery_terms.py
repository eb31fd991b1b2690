"""spec.delivery's headers, TLS and retry limits end to end: real workers,
real receivers on loopback (HTTPS with a test CA and client certificates
where TLS is the point), and ``hooklane endpoint apply`` as a process:
the tests that run it are ``processes``, the others ``db``."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
import re
import ssl
import subprocess
import textwrap
from collections.abc import Iterator, Mapping
from pathlib import Path

import aiohttp
import pytest
from cryptography.hazmat.primitives.asymmetric import rsa
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane import store
from hooklane import tls as tls_contexts
from hooklane.delivery import DeliverySpec, HeaderSpec, RequestTerms, SecretKeyRef, TlsSpec, resolve
from hooklane.errors import InvalidInput
from hooklane.health import as_json
from hooklane.policies import RetryPolicy
from hooklane.secrets import Keyring, seal, terms_owner
from hooklane.spec import EndpointSpec
from hooklane.views import detail_json
from hooklane.worker.sender import failure_class
from hooklane.worker.terms import TermsCache
from testsupport import certs
from testsupport.cli import hooklane as run_hooklane
from testsupport.fixtures import SECRET, add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer, OpenSslReceiver, Receiver

FAST_RETRY = RetryPolicy(base_seconds=0.2, cap_seconds=1.0)
API_KEY = "sk_live_7Qm2Zr9Xw4Lp"
KEYRING = Keyring.parse("k1:" + base64.b64encode(b"\x11" * 32).decode())
API_HEADERS = DeliverySpec(
    headers=(HeaderSpec("X-Api-Key", secret=SecretKeyRef("api", "token")), HeaderSpec("X-Team", "payments"))
)


def terms(delivery: DeliverySpec, secrets: Mapping[str, Mapping[str, str | None]]) -> RequestTerms | None:
    return resolve(delivery, "default", secrets.get)


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


@pytest.mark.db
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


# Local mode: hooklane endpoint apply --secrets-file.

MANIFEST = textwrap.dedent(
    """\
    apiVersion: hooklane.io/v1alpha1
    kind: WebhookEndpoint
    metadata: {name: orders, namespace: shop}
    spec:
      url: URL
      tenant: acme
      secretRef: {name: signing, key: secret}
      delivery:
        headers:
          - name: Authorization
            valueFrom: {secretKeyRef: {name: receiver-api, key: token}}
          - name: X-Team
            value: payments
    """
)


def manifest(url: str = "http://127.0.0.1:9/hooks") -> str:
    return MANIFEST.replace("URL", url)


def secrets_yaml(token: str, namespace: str = "shop") -> str:
    encoded = base64.b64encode(f"Bearer {token}\n".encode()).decode()
    return textwrap.dedent(
        f"""\
        apiVersion: v1
        kind: Secret
        metadata: {{name: other, namespace: shop}}
        stringData: {{token: unrelated}}
        ---
        apiVersion: v1
        kind: Secret
        metadata: {{name: receiver-api, namespace: {namespace}}}
        type: Opaque
        data: {{token: {encoded}}}
        """
    )


def apply(dsn: str, files: Path, *secrets_file: str):
    """``hooklane endpoint apply`` of files/endpoint.yaml, in a thread."""
    args = ["endpoint", "apply", "-f", str(files / "endpoint.yaml"), "--secret-file", str(files / "secret")]
    if secrets_file:
        args += ["--secrets-file", str(files / secrets_file[0])]
    return asyncio.to_thread(run_hooklane, dsn, *args)


@pytest.fixture
def files(tmp_path: Path) -> Path:
    (tmp_path / "secret").write_text(SECRET + "\n")
    (tmp_path / "endpoint.yaml").write_text(manifest())
    return tmp_path


@pytest.mark.processes
async def test_apply_reads_header_secrets_and_a_rotation_reaches_the_next_delivery(
    dsn, db, receiver, start_worker, files
):
    (files / "endpoint.yaml").write_text(manifest(receiver.on("orders", Answer(204))))
    (files / "one.yaml").write_text(secrets_yaml("one"))
    (files / "two.yaml").write_text(secrets_yaml("two"))
    created = await apply(dsn, files, "one.yaml")
    assert (created.returncode, created.stdout) == (0, "webhookendpoint shop/orders created\n"), (
        created.stderr
    )
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="evt-1")
    await wait_for(lambda: receiver.at("orders"))

    rotated = await apply(dsn, files, "two.yaml")
    assert (rotated.returncode, rotated.stdout) == (0, "webhookendpoint shop/orders configured\n"), (
        rotated.stderr
    )
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="evt-2")
    await wait_for(lambda: len(receiver.at("orders")) == 2)
    got = [
        (json.loads(r.body)["id"], r.headers["Authorization"], r.headers["X-Team"])
        for r in receiver.at("orders")
    ]
    assert got == [("evt-1", "Bearer one", "payments"), ("evt-2", "Bearer two", "payments")]
    assert "Bearer" not in created.stdout + created.stderr + rotated.stdout + rotated.stderr


@pytest.mark.processes
@pytest.mark.parametrize("name", ["Host", "webhook-signature", "Content-Length", "transfer-encoding"])
async def test_apply_refuses_a_header_hooklane_owns_and_stores_nothing(dsn, db, files, name):
    (files / "endpoint.yaml").write_text(manifest().replace("name: X-Team", f"name: {name}"))
    (files / "one.yaml").write_text(secrets_yaml("one"))
    result = await apply(dsn, files, "one.yaml")
    assert result.returncode == 2
    assert f"hooklane: spec.delivery.headers: item 1: name {name!r} may not be set" in result.stderr
    assert "Traceback" not in result.stderr
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0


@pytest.mark.processes
@pytest.mark.parametrize(
    "secrets, message",
    [
        (None, "--secrets-file: is required: spec.delivery refers to Secrets"),
        (
            secrets_yaml("one", namespace="elsewhere"),
            "--secrets-file: spec.delivery.headers[0].valueFrom.secretKeyRef: Secret shop/receiver-api not found",
        ),
        (
            secrets_yaml("one").replace("data: {token:", "data: {other:"),
            "--secrets-file: spec.delivery.headers[0].valueFrom.secretKeyRef: Secret shop/receiver-api has no key"
            " 'token'",
        ),
        (
            secrets_yaml("one").replace(
                "kind: Secret\nmetadata: {name: receiver", "kind: ConfigMap\nmetadata: {name: receiver"
            ),
            "hooklane: --secrets-file: document 2: must be a v1 Secret",
        ),
    ],
)
async def test_apply_refuses_a_secret_it_cannot_resolve_and_stores_nothing(dsn, db, files, secrets, message):
    if secrets is not None:
        (files / "secrets.yaml").write_text(secrets)
    result = await apply(dsn, files, *(() if secrets is None else ("secrets.yaml",)))
    assert result.returncode == 2
    assert message in result.stderr, result.stderr
    assert "Traceback" not in result.stderr and "Bearer" not in result.stderr
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0


# TLS: an HTTPS receiver with the test CA's certificate.

CA = certs.Authority()
CLIENT = certs.client(CA)
SECRETS = {"ca": {"ca.crt": CA.pem}, "client": {"tls.crt": CLIENT.cert, "tls.key": CLIENT.key}}


def server_context(tmp_path: Path, pem: certs.Pem, *, clients_of: certs.Authority | None) -> ssl.SSLContext:
    """A receiver's context, requiring a client certificate signed by
    ``clients_of`` when given."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    cert, key = tmp_path / "server.crt", tmp_path / "server.key"
    cert.write_text(pem.cert)
    key.write_text(pem.key)
    os.chmod(key, 0o600)
    context.load_cert_chain(cert, key)
    if clients_of is not None:
        context.verify_mode = ssl.CERT_REQUIRED
        context.load_verify_locations(cadata=clients_of.pem)
    return context


async def first_outcome(db) -> tuple[str, str | None, str | None]:
    """The delivery's state, failure and error after its first attempt."""
    await wait_for(lambda: db.fetchval("SELECT attempts > 0 AND state <> 'sending' FROM deliveries"), 30)
    row = await db.fetchrow("SELECT state, last_failure, last_error FROM deliveries")
    return row["state"], row["last_failure"], row["last_error"]


@pytest.mark.db
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


@pytest.mark.db
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


def test_a_worker_keeps_one_opened_terms_an_endpoint_and_opens_each_new_value():
    cache = TermsCache(KEYRING)
    owner = terms_owner("default", "mtls")
    resolved = terms(DeliverySpec(tls=TlsSpec(SecretKeyRef("ca", "ca.crt"), "client")), SECRETS)
    assert resolved is not None
    first = cache.get(seal(KEYRING, resolved.to_json(), owner), owner)
    assert first.ssl_context is not None
    sealed = seal(KEYRING, resolved.to_json(), owner)
    # The same terms sealed again by the next upsert: opened again, and
    # kept in place of the first, not beside it.
    again = cache.get(sealed, owner)
    assert again is not first and cache.get(sealed, owner) is again
    assert len(cache) == 1
    # A server name alone needs no context of its own: the client's shared
    # one verifies the name given.
    named = terms(DeliverySpec(tls=TlsSpec(None, None, "receiver.test")), SECRETS)
    assert named is not None
    opened = cache.get(
        seal(KEYRING, named.to_json(), terms_owner("default", "named")), terms_owner("default", "named")
    )
    assert opened.ssl_context is None and opened.server_name == "receiver.test"


def test_terms_a_row_holds_that_openssl_refuses_fail_the_attempt_as_an_invalid_endpoint():
    weak = CA.issue("weak", client=True, key=rsa.generate_private_key(65537, 1024))
    owner = terms_owner("default", "weak")
    stored = RequestTerms(cert_pem=weak.cert, key_pem=weak.key).to_json()
    with pytest.raises(InvalidInput) as refused:
        TermsCache(KEYRING).get(seal(KEYRING, stored, owner), owner)
    assert str(refused.value) == (
        "spec.delivery.tls (client_certificate): refused by OpenSSL: EE_KEY_TOO_SMALL"
    )


@pytest.mark.db
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


def _caused(exc: BaseException, cause: BaseException) -> BaseException:
    exc.__cause__ = cause
    return exc


# What uvloop leaves a sender whose certificate the receiver refused: the
# write's error, and the connection's end that carries the alert. The alert
# as a receiver's reset leaves it unread: one TLS 1.3 record of 19 bytes.
WRITE_FAILED = _caused(
    aiohttp.ClientOSError(None, "Can not write request body for https://receiver.test/"),
    aiohttp.ClientConnectionResetError("Cannot write to closing transport"),
)
ALERT = ssl.SSLError(1, "[SSL: TLSV13_ALERT_CERTIFICATE_REQUIRED] tlsv13 alert certificate required")
UNREAD_ALERT = bytes.fromhex("1703030013") + bytes(19)


@pytest.mark.parametrize(
    "exc, lost, unread, expected",
    [
        (WRITE_FAILED, None, b"", "connection_failed"),
        (WRITE_FAILED, _caused(aiohttp.ClientConnectionError("Connection lost"), ALERT), b"", "tls_error"),
        (WRITE_FAILED, ALERT, b"", "tls_error"),
        (WRITE_FAILED, ConnectionResetError(104, "Connection reset by peer"), b"", "connection_failed"),
        (aiohttp.ClientOSError(104, "Connection reset by peer"), None, UNREAD_ALERT, "tls_error"),
        # More than an alert, a longer record, or a handshake record: not
        # an alert alone, and not guessed at.
        (WRITE_FAILED, None, UNREAD_ALERT * 2, "connection_failed"),
        (WRITE_FAILED, None, bytes.fromhex("1703030014") + bytes(20), "connection_failed"),
        (WRITE_FAILED, None, bytes.fromhex("1603030013") + bytes(19), "connection_failed"),
        (WRITE_FAILED, None, UNREAD_ALERT[:-1], "connection_failed"),
        # A timeout stays one, whatever the connection ended with.
        (TimeoutError(), ALERT, UNREAD_ALERT, "timeout"),
        (aiohttp.ServerDisconnectedError(), ALERT, b"", "tls_error"),
    ],
)
def test_a_connection_failure_is_a_tls_error_when_its_connection_ended_with_an_alert(
    exc, lost, unread, expected
):
    assert failure_class(exc, 5, lost, unread)[0] == expected


@pytest.mark.processes
@pytest.mark.parametrize("reset", [False, True], ids=["closed-politely", "reset"])
async def test_a_refused_client_certificate_is_a_tls_error_on_the_workers_own_loop(dsn, db, tmp_path, reset):
    # `hooklane worker` runs on uvloop (cli.py), where the alert closes the
    # connection while aiohttp still writes the body: that write's error
    # said "connection failed" for about half of such attempts, on this
    # receiver whether it closes politely (as nginx does) or with a reset.
    # Twenty deliveries at once, each one attempt: twenty chances to misfile.
    attempts = 20
    context = server_context(tmp_path, certs.server(CA), clients_of=CA)
    with OpenSslReceiver(context, reset=reset) as receiver:
        delivery = DeliverySpec(tls=TlsSpec(SecretKeyRef("ca", "ca.crt")))
        await add_endpoint(
            db,
            "mtls",
            receiver.url("mtls"),
            delivery=delivery,
            terms=terms(delivery, SECRETS),
            max_concurrency=attempts,
        )
        for i in range(attempts):
            await hooklane.publish(db, tenant="acme", type="order.created", data={}, id=f"evt-{i}")
        worker = worker_process(dsn, HOOKLANE_CIRCUIT_THRESHOLD=str(attempts * 2))
        # The first attempts: a retry waits at least half its 30 s backoff.
        first = "SELECT failure, count(*) FROM delivery_attempts WHERE attempt = 1 GROUP BY 1"
        try:
            await wait_for(lambda: db.fetchval(f"SELECT sum(count) = $1 FROM ({first}) f", attempts), 60)
        finally:
            worker.terminate()
            worker.wait(timeout=30)
        assert {r["failure"]: r["count"] for r in await db.fetch(first)} == {"tls_error": attempts}
        assert len(receiver.refused) >= attempts and not receiver.heads


@pytest.mark.db
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


# Retry limits of the endpoint's own.


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
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

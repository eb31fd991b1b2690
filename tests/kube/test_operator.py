"""The operator against a real kube-apiserver, a real Postgres and real
receivers: ``hooklane operator`` runs as a process, exactly as deployed."""

from __future__ import annotations

import json
import socket
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import yaml
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane.delivery import RequestTerms
from hooklane.policies import CircuitPolicy, RetryPolicy
from hooklane.secrets import terms_owner, unseal
from testsupport.chart import CHART
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.held_keys import kill_head, publish_ordered
from testsupport.kube_fixtures import EXAMPLES, ROTATED, Kube, Operator, endpoint, row, secret
from testsupport.receivers import Answer, Received

# Retries within a second, so that recovery does not wait on the contract's 30 s.
FAST_RETRY = RetryPolicy(base_seconds=0.2, cap_seconds=0.5)


async def publish(db: asyncpg.Connection, type_: str = "order.created", **data: Any) -> str:
    async with db.transaction():
        return await hooklane.publish(db, tenant="acme", type=type_, data=data)


async def test_kubectl_apply_creates_the_endpoint_and_edits_follow(kube, db, start_operator):
    start_operator()
    await kube.run("apply", "-f", str(EXAMPLES / "secret.yaml"))
    await kube.run("apply", "-f", str(EXAMPLES / "endpoint.yaml"))

    stored = await wait_for(lambda: row(db))
    assert (stored["namespace"], stored["tenant"], stored["url"]) == (
        kube.namespace,
        "acme",
        "http://127.0.0.1:9000/hooks/acme",
    )
    assert (stored["max_concurrency"], stored["event_types"], stored["secret"]) == (4, ["order.*"], SECRET)
    # spec.ordering left out: the safe default, Hold.
    assert stored["ordering_on_dead"] == "hold"
    ready = await wait_for(lambda: kube.condition("Ready"))
    assert (ready["status"], ready["reason"], ready["observedGeneration"]) == ("True", "Synced", 1)
    body = await wait_for(lambda: _with_status(kube, "phase"))
    assert body["status"]["phase"] == "Active"
    assert body["status"]["observedGeneration"] == 1
    assert "hooklane.io/finalizer" in body["metadata"]["finalizers"]

    await kube.apply(
        endpoint("https://hooks.example.com/acme", maxConcurrency=9, ordering={"onDeadDelivery": "Skip"})
    )

    async def edited():
        r = await row(db)
        wanted = ("https://hooks.example.com/acme", 9, "skip")
        return r if (r["url"], r["max_concurrency"], r["ordering_on_dead"]) == wanted else None

    await wait_for(edited)
    body = await wait_for(lambda: _with_status(kube, "observedGeneration", 2))
    ready = next(c for c in body["status"]["conditions"] if c["type"] == "Ready")
    assert ready["observedGeneration"] == 2
    columns = await kube.columns()
    assert (columns["MAXCONCURRENCY"], columns["PHASE"], columns["PENDING"]) == ("9", "Active", "0")

    # Status passes run every 0.3 s; with nothing new they write nothing.
    status_pass = await canary(kube, db)
    version = (await kube.get())["metadata"]["resourceVersion"]
    await status_pass()
    assert (await kube.get())["metadata"]["resourceVersion"] == version


async def test_rotating_the_secret_changes_the_signature(kube, db, receiver, start_operator, start_worker):
    start_operator()
    start_worker()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint(receiver.on("hooks", Answer(204))))
    await wait_for(lambda: row(db))

    await publish(db, order=1)
    first = (await wait_for(lambda: receiver.at("hooks")))[0]
    Webhook(SECRET).verify(first.body, first.headers)

    await kube.apply(secret(ROTATED))
    await wait_for(lambda: _secret_is(db, ROTATED))
    await publish(db, order=2)
    second = (await wait_for(lambda: receiver.at("hooks")[1:]))[0]
    assert Webhook(ROTATED).verify(second.body, second.headers)["data"] == {"order": 2}
    # the replaced secret signs too, for the grace (docs/security.md)
    assert len(second.headers["webhook-signature"].split(" ")) == 2
    Webhook(SECRET).verify(second.body, second.headers)


async def test_a_rotation_during_a_database_outage_is_stored_once_it_ends(
    kube, dsn, database_outage, start_operator
):
    op = start_operator()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint("http://127.0.0.1:9/hooks"))
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))

    with database_outage():
        await kube.apply(secret(ROTATED))
        await wait_for(lambda: "keeps its old secret" in op.output())

    # kopf never retries an event handler: the status pass does, after its 5 s back-off.
    db = await asyncpg.connect(dsn)
    try:
        await wait_for(lambda: _secret_is(db, ROTATED), timeout=20)
    finally:
        await db.close()


async def test_a_restart_writes_only_what_changed_while_the_operator_was_down(kube, db, start_operator):
    """A restart reads Postgres once instead of upserting every resource: a
    resource and Secret that Postgres already holds are not written again;
    one edited while the operator was down, and one whose row Postgres lost
    track of, are."""
    op = start_operator()
    await kube.apply(secret(SECRET))
    names = ("kept", "edited", "drifted")
    for name in names:
        doc = endpoint(f"http://127.0.0.1:9/{name}")
        doc["metadata"]["name"] = name
        await kube.apply(doc)
    for name in names:
        await wait_for(lambda name=name: _ready_synced(kube, name))
        # The status pass may say Ready before kopf records the creation as
        # handled; stopped in between, kopf would create it again.
        await wait_for(lambda name=name: _handled(kube, name))
    op.stop()
    written = {r["name"]: r["updated_at"] for r in await db.fetch("SELECT name, updated_at FROM endpoints")}

    edited = endpoint("https://hooks.example.com/edited")
    edited["metadata"]["name"] = "edited"
    await kube.apply(edited)
    await db.execute("UPDATE endpoints SET url = 'https://elsewhere.example.com/' WHERE name = 'drifted'")
    drifted_at = await db.fetchval("SELECT updated_at FROM endpoints WHERE name = 'drifted'")

    op = start_operator()

    async def caught_up() -> bool:
        urls = dict(await db.fetch("SELECT name, url FROM endpoints"))
        return urls == {
            "kept": "http://127.0.0.1:9/kept",
            "edited": "https://hooks.example.com/edited",
            "drifted": "http://127.0.0.1:9/drifted",
        }

    await wait_for(caught_up)
    await wait_for(lambda: "resources compared with Postgres" in op.output() or None)
    # Status passes after the start's: none writes the kept endpoint.
    status_pass = await canary(kube, db)
    await status_pass()
    await status_pass()
    now = {r["name"]: r["updated_at"] for r in await db.fetch("SELECT name, updated_at FROM endpoints")}
    assert now["kept"] == written["kept"]
    assert now["edited"] > written["edited"]
    assert now["drifted"] > drifted_at
    assert (await row(db, "kept"))["secret"] == SECRET
    await wait_for(lambda: _ready_synced(kube, "kept"))


async def canary(kube: Kube, db: asyncpg.Connection) -> Callable[[], Awaitable[None]]:
    """A resource of a tenant of its own, and a call that returns once a
    status pass begun after the call has run: it gives the canary one more
    pending event and waits for its status to show it."""
    doc = endpoint("http://127.0.0.1:9/canary", tenant="canary")
    doc["metadata"]["name"] = "canary"
    await kube.apply(doc)
    await wait_for(lambda: _with_status(kube, "pending", 0, name="canary"))
    published = 0

    async def status_pass() -> None:
        nonlocal published
        published += 1
        await hooklane.publish(db, tenant="canary", type="order.created", data={})
        await wait_for(lambda: _with_status(kube, "pending", published, name="canary"))

    return status_pass


async def _handled(kube: Kube, name: str) -> bool:
    body = await kube.get(name) or {}
    return "kopf.zalando.org/last-handled-configuration" in body.get("metadata", {}).get("annotations", {})


async def _ready_synced(kube: Kube, name: str) -> dict | None:
    ready = await kube.condition("Ready", name)
    return ready if ready and ready["reason"] == "Synced" else None


async def test_a_missing_or_malformed_secret_holds_deliveries(
    kube, db, receiver, start_operator, start_worker
):
    start_operator()
    start_worker()
    await kube.apply(endpoint(receiver.on("hooks", Answer(204))))
    # Signed, in Postgres only: its deliveries show the worker's rounds.
    await add_endpoint(db, "canary", receiver.on("canary", Answer(204)), tenant="canary")

    async def held() -> None:
        """A round after the event ran (another endpoint's later event was
        delivered), and left it alone: not reserved, not sent."""
        sent = len(receiver.at("canary"))
        await hooklane.publish(db, tenant="canary", type="order.created", data={})
        await wait_for(lambda: len(receiver.at("canary")) > sent)
        assert receiver.at("hooks") == []
        delivery = await db.fetchrow(
            "SELECT d.state, d.attempts FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id"
            " WHERE ep.name = 'orders-acme'"
        )
        assert tuple(delivery) == ("pending", 0)

    ready = await wait_for(lambda: _condition_reason(kube, "Ready", "SecretMissing"))
    assert ready["status"] == "False"
    assert f"Secret {kube.namespace}/acme-webhook-secret not found" in ready["message"]
    assert (await row(db))["secret"] is None
    await publish(db, order=1)
    await held()

    await kube.apply(secret("not-a-webhook-secret"))
    ready = await wait_for(lambda: _condition_reason(kube, "Ready", "SecretInvalid"))
    assert "is not a Standard Webhooks secret" in ready["message"]
    await held()

    await kube.apply(secret(SECRET))
    got = (await wait_for(lambda: receiver.at("hooks")))[0]
    Webhook(SECRET).verify(got.body, got.headers)
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))
    assert {"SecretMissing", "SecretInvalid", "SecretResolved"} <= set(
        await wait_for(lambda: _events_include(kube, "SecretResolved"))
    )


def api_key(value: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "acme-api-key"},
        "type": "Opaque",
        "stringData": {"token": value},
    }


def _header(got: Received, name: str) -> str | None:
    return next((v for k, v in got.headers.items() if k.lower() == name.lower()), None)


async def _terms(db: asyncpg.Connection, namespace: str) -> RequestTerms | None:
    """The request terms the operator stored (sealed only with a key, which
    these operators have none of)."""
    sealed = (await row(db))["request_terms"]
    if sealed is None:
        return None
    return RequestTerms.from_json(unseal(None, sealed, terms_owner(namespace, "orders-acme")))


async def test_a_header_from_a_secret_follows_the_secret(kube, db, receiver, start_operator, start_worker):
    """spec.delivery.headers[].valueFrom.secretKeyRef: the Secret's value is
    sent, a patch of it is sent from the next delivery on with nothing
    restarted, and while the Secret is gone nothing is sent at all."""
    start_operator()
    start_worker()
    await kube.apply(secret(SECRET))
    await kube.apply(api_key("sk-first"))
    header = {"name": "X-Api-Key", "valueFrom": {"secretKeyRef": {"name": "acme-api-key", "key": "token"}}}
    await kube.apply(
        endpoint(receiver.on("hooks", Answer(204)), maxConcurrency=3, delivery={"headers": [header]})
    )
    # Signed, in Postgres only: its deliveries show the worker's rounds.
    await add_endpoint(db, "canary", receiver.on("canary", Answer(204)), tenant="canary")
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))

    await publish(db, order=1)
    first = (await wait_for(lambda: receiver.at("hooks")))[0]
    assert _header(first, "X-Api-Key") == "sk-first"
    Webhook(SECRET).verify(first.body, first.headers)
    # Not adaptive: the limit in force is maxConcurrency, and follows it.
    assert (await wait_for(lambda: _with_status(kube, "effectiveConcurrency")))["status"][
        "effectiveConcurrency"
    ] == 3
    await kube.apply(endpoint(receiver.url("hooks"), maxConcurrency=5, delivery={"headers": [header]}))
    await wait_for(lambda: _with_status(kube, "effectiveConcurrency", 5))

    await kube.run("patch", "secret", "acme-api-key", "--type=merge", "-p", json.dumps(api_key("sk-second")))

    async def rotated() -> bool:
        terms = await _terms(db, kube.namespace)
        return terms is not None and terms.headers == (("X-Api-Key", "sk-second"),)

    await wait_for(rotated)
    await publish(db, order=2)
    second = (await wait_for(lambda: receiver.at("hooks")[1:]))[0]
    assert _header(second, "X-Api-Key") == "sk-second"
    assert Webhook(SECRET).verify(second.body, second.headers)["data"] == {"order": 2}

    await kube.run("delete", "secret", "acme-api-key")
    ready = await wait_for(lambda: _condition_reason(kube, "Ready", "SecretMissing"))
    assert ready["status"] == "False"
    assert ready["message"].startswith("spec.delivery.headers[0].valueFrom.secretKeyRef: ")
    assert f"Secret {kube.namespace}/acme-api-key not found" in ready["message"]
    # Unsigned: never reserved, so nothing goes out without the header.
    assert (await row(db))["secret"] is None
    await publish(db, order=3)
    # A round after the event ran (another endpoint's later event was
    # delivered), and left it alone.
    sent = len(receiver.at("canary"))
    await hooklane.publish(db, tenant="canary", type="order.created", data={})
    await wait_for(lambda: len(receiver.at("canary")) > sent)
    assert len(receiver.at("hooks")) == 2
    delivering = await kube.condition("Delivering")
    assert delivering is not None and delivering["reason"] == "NoSigningSecret"

    await kube.apply(api_key("sk-third"))
    third = (await wait_for(lambda: receiver.at("hooks")[2:]))[0]
    assert _header(third, "X-Api-Key") == "sk-third"
    assert Webhook(SECRET).verify(third.body, third.headers)["data"] == {"order": 3}
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))
    assert len(receiver.at("hooks")) == 3


def _certificate(name: str) -> tuple[str, str]:
    """A self-signed certificate and its key, PEM."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=1))
        .not_valid_after(now + timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem.decode()


async def test_tls_material_from_secrets_is_stored_for_the_workers(kube, db, start_operator):
    """A CA bundle as distributions and certifi write them (a comment before
    each certificate) and a kubernetes.io/tls Secret become the endpoint's
    request terms, as `hooklane endpoint apply --secrets-file` takes them."""
    start_operator()
    ca, _ = _certificate("Hooklane test CA")
    bundle = f"# Issuer: CN=Hooklane test CA\n# Label: test\n{ca}\n# Issuer: CN=another\n{_certificate('other')[0]}"
    cert, key = _certificate("hooklane client")
    await kube.apply(secret(SECRET))
    await kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "acme-ca"},
            "stringData": {"ca.crt": bundle},
        }
    )
    await kube.apply(
        {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "acme-client"},
            "type": "kubernetes.io/tls",
            "stringData": {"tls.crt": cert, "tls.key": key},
        }
    )
    tls = {
        "caSecretRef": {"name": "acme-ca"},
        "clientCertificateSecretRef": {"name": "acme-client"},
        "serverName": "hooks.internal.example",
    }
    await kube.apply(endpoint("https://127.0.0.1:9/hooks", delivery={"tls": tls}))

    ready = await wait_for(lambda: _ready_synced(kube, "orders-acme"), timeout=20)
    assert ready["status"] == "True"
    terms = await _terms(db, kube.namespace)
    assert terms == RequestTerms((), bundle.strip(), cert.strip(), key.strip(), "hooks.internal.example")


async def test_deletion_runs_the_finalizer(kube, db, start_operator):
    start_operator()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint("http://127.0.0.1:9/hooks"))
    endpoint_id = (await wait_for(lambda: row(db)))["id"]
    await publish(db, order=1)
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE endpoint_id = $1", endpoint_id) == 1

    await kube.run("delete", "whe", "orders-acme", "--timeout=30s")

    assert await kube.get() is None
    assert await row(db) is None
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 0
    # Events stay, for reconciliation.
    assert await db.fetchval("SELECT count(*) FROM events") == 1


async def test_a_failing_receiver_pauses_the_endpoint_until_it_recovers(
    kube, db, receiver, start_operator, start_worker
):
    failing = True
    url = receiver.on("hooks", lambda _: Answer(500 if failing else 204))
    start_operator()
    start_worker(circuit=CircuitPolicy(threshold=20, step_seconds=1, cap_seconds=2), retry=FAST_RETRY)
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint(url))
    await wait_for(lambda: row(db))
    for n in range(20):
        await publish(db, order=n)

    columns = await wait_for(lambda: _columns_show(kube, "PHASE", "Paused"), timeout=30)
    assert int(columns["PENDING"]) > 0
    paused = await kube.get()
    assert paused["status"]["consecutiveFailures"] >= 20
    assert paused["status"]["lastError"]
    delivering = next(c for c in paused["status"]["conditions"] if c["type"] == "Delivering")
    assert (delivering["status"], delivering["reason"]) == ("False", "CircuitOpen")

    failing = False
    columns = await wait_for(lambda: _columns_show(kube, "PENDING", "0", phase="Active"), timeout=30)
    assert columns["OLDESTPENDINGAGE"] == "0"
    assert len({json.loads(r.body)["id"] for r in receiver.at("hooks") if r.body}) == 20
    recovered = await kube.get()
    assert recovered["status"]["consecutiveFailures"] == 0
    assert recovered["status"]["lastDeliveredAt"]
    assert "pausedUntil" not in recovered["status"]
    assert {"EndpointPaused", "EndpointResumed"} <= set(
        await wait_for(lambda: _events_include(kube, "EndpointResumed"))
    )


async def test_deactivated_endpoint_is_reactivated_and_dead_deliveries_resent(
    kube, db, receiver, start_operator, start_worker
):
    gone = True
    url = receiver.on("hooks", lambda _: Answer(410 if gone else 204))
    start_operator()
    start_worker()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint(url))
    await wait_for(lambda: row(db))
    await publish(db, order=1)

    columns = await wait_for(lambda: _columns_show(kube, "PHASE", "Deactivated"))
    assert columns["PENDING"] == "0"
    body = await wait_for(lambda: _with_status(kube, "dead", 1))
    assert body["status"]["lastError"]
    assert {"EndpointDeactivated", "DeliveriesDead"} <= set(
        await wait_for(lambda: _events_include(kube, "DeliveriesDead"))
    )

    gone = False
    await kube.run("annotate", "whe", "orders-acme", "hooklane.io/reactivate=1")
    await wait_for(lambda: _columns_show(kube, "PHASE", "Active"))
    assert (await row(db))["state"] == "active"
    await kube.run("annotate", "whe", "orders-acme", "--overwrite", "hooklane.io/resend-dead=1")
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"))
    await wait_for(lambda: _with_status(kube, "dead", 0))
    assert {"ReactivateRequested", "EndpointReactivated", "ResendRequested"} <= set(
        await wait_for(lambda: _events_include(kube, "ResendRequested"))
    )


async def test_the_reactivate_annotation_on_an_active_endpoint_resets_nothing(kube, db, start_operator):
    start_operator()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint("http://127.0.0.1:9/hooks"))
    await wait_for(lambda: row(db))
    await db.execute("UPDATE endpoints SET consecutive_failures = 5, failing_since = now()")
    before = await row(db)
    await kube.run("annotate", "whe", "orders-acme", "hooklane.io/reactivate=1")

    async def annotation_removed() -> bool:
        body = await kube.get()
        return body is not None and "hooklane.io/reactivate" not in body["metadata"].get("annotations", {})

    await wait_for(annotation_removed, timeout=30)
    after = await row(db)
    assert (after["state"], after["consecutive_failures"], after["failing_since"]) == (
        "active",
        5,
        before["failing_since"],
    )
    assert "ReactivateRequested" not in await kube.events()


async def test_publish_reaches_a_receiver_declared_only_in_kubernetes(
    kube, db, receiver, start_operator, start_worker
):
    start_operator()
    start_worker()
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint(receiver.on("orders", Answer(204)), eventTypes=["order.*"]))
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))

    event_id = await publish(db, "order.paid", order=7)
    await publish(db, "invoice.paid", invoice=1)

    got = (await wait_for(lambda: receiver.at("orders")))[0]
    payload = Webhook(SECRET).verify(got.body, got.headers)
    assert (payload["id"], payload["type"], payload["data"]) == (event_id, "order.paid", {"order": 7})
    body = await wait_for(lambda: _with_status(kube, "lastDeliveredAt"))
    assert body["status"]["pending"] == 0
    assert len(receiver.at("orders")) == 1


async def test_held_keys_show_in_the_status_while_there_are_some(kube, db, start_operator):
    start_operator()
    await kube.run("apply", "-f", str(EXAMPLES / "secret.yaml"))
    await kube.run("apply", "-f", str(EXAMPLES / "endpoint.yaml"))
    await wait_for(lambda: _with_status(kube, "phase"))
    await publish_ordered(db, "order-1", ["o1-created", "o1-paid"])
    await publish_ordered(db, "order-2", ["o2-created"])
    for key in ("order-1", "order-2"):
        await kill_head(db, "orders-acme", key, namespace=kube.namespace)
    await wait_for(lambda: _with_status(kube, "ordering", {"heldKeys": 2}))
    # Released (as a resend or a discard of the heads does): gone again.
    await db.execute("UPDATE ordering_keys SET held_since = NULL")
    await wait_for(lambda: _without_status(kube, "ordering"))


async def _without_status(kube: Kube, field: str, name: str = "orders-acme") -> dict | None:
    body = await kube.get(name)
    return body if body is not None and field not in body.get("status", {}) else None


async def _with_status(kube: Kube, field: str, value: Any = None, name: str = "orders-acme") -> dict | None:
    body = await kube.get(name)
    got = (body or {}).get("status", {}).get(field)
    if value is None:
        return body if got is not None else None
    return body if got == value else None


async def _condition_reason(kube: Kube, type_: str, reason: str) -> dict | None:
    condition = await kube.condition(type_)
    return condition if condition and condition["reason"] == reason else None


async def _columns_show(kube: Kube, column: str, value: str, phase: str | None = None) -> dict | None:
    columns = await kube.columns()
    if columns.get(column) != value or (phase and columns.get("PHASE") != phase):
        return None
    return columns


async def _events_include(kube: Kube, reason: str) -> list[str] | None:
    reasons = await kube.events()
    return reasons if reason in reasons else None


async def _secret_is(db: asyncpg.Connection, value: str) -> bool:
    return (await row(db))["secret"] == value


async def test_the_chart_rbac_is_enough(kube, control_plane, db, start_operator, tmp_path, tools):
    """The operator, logged in as the chart's ServiceAccount with the chart's
    RBAC for a watched namespace, syncs, reports, posts Events, deletes, and
    stays active through the chart's KopfPeering."""
    rendered = tools.helm(
        "template",
        "hooklane",
        str(CHART),
        "--namespace",
        kube.namespace,
        "--set",
        "database.existingSecret=unused",
        # Without the API, which would need a token to render.
        "--set",
        "api.enabled=false",
        "--set",
        f"operator.watchNamespaces={{{kube.namespace}}}",
        "--show-only",
        "templates/serviceaccounts.yaml",
        "--show-only",
        "templates/operator-rbac.yaml",
        "--show-only",
        "templates/operator-peering.yaml",
    ).stdout
    docs = [doc for doc in yaml.safe_load_all(rendered) if doc]
    await kube.apply({"apiVersion": "v1", "kind": "List", "items": docs})
    token = (await kube.run("create", "token", "hooklane-operator")).strip()
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    config["users"][0]["user"] = {"token": token}
    as_operator = tmp_path / "operator.kubeconfig"
    as_operator.write_text(json.dumps(config))
    port = free_port()
    op = start_operator(
        "--peering", "hooklane", "--liveness", f"http://127.0.0.1:{port}/healthz", kubeconfig=as_operator
    )
    await wait_for(lambda: _active(op), timeout=30)

    await kube.apply(endpoint("http://127.0.0.1:9/hooks"))
    await wait_for(lambda: _condition_reason(kube, "Ready", "SecretMissing"))
    await kube.apply(secret(SECRET))
    await wait_for(lambda: _condition_reason(kube, "Ready", "Synced"))
    assert "SecretMissing" in await wait_for(lambda: _events_include(kube, "SecretResolved"))
    assert (await row(db))["secret"] == SECRET
    probe = await wait_for(lambda: _get_json(f"http://127.0.0.1:{port}/healthz"))
    assert probe["database"] is True
    await kube.run("delete", "whe", "orders-acme", "--timeout=30s")
    assert await row(db) is None
    output = op.output()
    assert "Forbidden" not in output and "Not enough permissions" not in output, output


async def test_peering_keeps_one_of_two_replicas_active(kube, db, start_operator):
    await kube.apply({"apiVersion": "kopf.dev/v1", "kind": "KopfPeering", "metadata": {"name": "hooklane"}})
    replicas = [start_operator("--peering", "hooklane"), start_operator("--peering", "hooklane")]

    async def settled():
        peering = json.loads(await kube.run("get", "kopfpeering", "hooklane", "-o", "json"))
        active = [op for op in replicas if _active(op)]
        return active[0] if len(peering.get("status", {})) == 2 and len(active) == 1 else None

    active = await wait_for(settled, timeout=30)
    standby = next(op for op in replicas if op is not active)
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint("http://127.0.0.1:9/hooks"))
    await wait_for(lambda: row(db))
    await wait_for(lambda: "Handler 'sync' succeeded" in active.output())
    assert "Handler 'sync' succeeded" not in standby.output()

    active.stop()
    await wait_for(lambda: _active(standby), timeout=30)
    await kube.apply(endpoint("http://127.0.0.1:9/hooks", maxConcurrency=7))
    await wait_for(lambda: db.fetchval("SELECT max_concurrency = 7 FROM endpoints"))


def _active(op: Operator) -> bool:
    """kopf logs the moment a replica resumes and the moment it pauses in
    favour of a peer; the later of the two is where it stands."""
    output = op.output()
    return output.rfind("Resuming operations") > output.rfind("Pausing operations")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


async def _get_json(url: str) -> dict[str, Any] | None:
    try:
        async with aiohttp.ClientSession() as session, session.get(url) as response:
            return await response.json() if response.status == 200 else None
    except aiohttp.ClientError:
        return None

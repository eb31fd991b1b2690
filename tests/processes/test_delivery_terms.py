"""spec.delivery's header secrets and TLS through ``hooklane endpoint apply``
and a worker, as processes: apply reads the secrets, refuses what it cannot
take and stores nothing then, and a refused client certificate is a TLS
error on the worker's own loop."""

from __future__ import annotations

import asyncio
import base64
import json
import textwrap
from pathlib import Path

import pytest

import hooklane
from hooklane.delivery import DeliverySpec, SecretKeyRef, TlsSpec
from testsupport import certs
from testsupport.cli import hooklane as run_hooklane
from testsupport.delivery_terms import CA, SECRETS, server_context, terms
from testsupport.fixtures import SECRET, add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer, OpenSslReceiver

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


@pytest.mark.parametrize("name", ["Host", "webhook-signature", "Content-Length", "transfer-encoding"])
async def test_apply_refuses_a_header_hooklane_owns_and_stores_nothing(dsn, db, files, name):
    (files / "endpoint.yaml").write_text(manifest().replace("name: X-Team", f"name: {name}"))
    (files / "one.yaml").write_text(secrets_yaml("one"))
    result = await apply(dsn, files, "one.yaml")
    assert result.returncode == 2
    assert f"hooklane: spec.delivery.headers: item 1: name {name!r} may not be set" in result.stderr
    assert "Traceback" not in result.stderr
    assert await db.fetchval("SELECT count(*) FROM endpoints") == 0


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

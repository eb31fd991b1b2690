"""The operator moving an endpoint to another tenant, and rotating its
sealed signing secret, against a real kube-apiserver, Postgres and
receivers."""

from __future__ import annotations

import base64
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane.secrets import Keyring, unseal
from testsupport import timings
from testsupport.fixtures import SECRET, wait_for
from testsupport.kube_fixtures import ROTATED, Kube, Operator, endpoint, row, secret
from testsupport.receivers import Answer

KEY = base64.b64encode(b"operator-test-encryption-key-32b").decode()
KEYRING = Keyring.parse(f"k1:{KEY}")


@pytest.fixture
def operator(kubeconfig: Path, dsn: str, kube_namespace: str, tmp_path: Path) -> Iterator[Operator]:
    env = {
        **os.environ,
        "KUBECONFIG": str(kubeconfig),
        "HOOKLANE_DATABASE_URL": dsn,
        **timings.environment(timings.OPERATOR),
        "HOOKLANE_ENCRYPTION_KEY": f"k1:{KEY}",
        "HOOKLANE_SECRET_GRACE_SECONDS": "600",
    }
    op = Operator(tmp_path / "operator.log", ["--standalone", "--namespace", kube_namespace], env)
    yield op
    op.stop()
    print(f"--- operator.log (exit {op.proc.returncode}) ---\n{op.output()[-6000:]}")


async def test_a_tenant_change_discards_the_old_tenants_deliveries_with_an_event(
    control_plane, kube_namespace, db, receiver, operator, start_worker
):
    kube = Kube(control_plane, kube_namespace)
    url = receiver.on("hooks", Answer(204))
    await kube.apply(secret(SECRET))
    await kube.apply(endpoint(url))
    stored = await wait_for(lambda: row(db))
    assert stored["secret"].startswith("enc:v1:k1:")
    assert unseal(KEYRING, stored["secret"], f"{kube_namespace}/orders-acme") == SECRET
    for n in range(2):
        await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": n})

    await kube.apply(endpoint(url, tenant="globex"))
    await wait_for(lambda: db.fetchval("SELECT tenant = 'globex' FROM endpoints"))
    assert [tuple(r) for r in await db.fetch("SELECT state, last_error FROM deliveries")] == [
        ("discarded", "discarded: the endpoint's tenant changed from acme to globex")
    ] * 2

    async def tenant_changed() -> dict | None:
        out = await kube.run(
            "get", "events", "--field-selector", "involvedObject.name=orders-acme", "-o", "json"
        )
        return next((e for e in json.loads(out)["items"] if e["reason"] == "TenantChanged"), None)

    event = await wait_for(tenant_changed)
    assert event["type"] == "Warning"
    assert event["message"] == (
        "spec.tenant changed from acme to globex: 2 pending or dead deliveries of acme's events "
        "discarded, never to be sent to this endpoint"
    )
    assert "endpoint " + kube_namespace + "/orders-acme moved from tenant acme to globex" in operator.output()

    # A rotation: the replaced secret, sealed too, signs for the grace.
    await kube.apply(secret(ROTATED))
    rotated = await wait_for(lambda: db.fetchrow("SELECT * FROM endpoints WHERE previous_secret IS NOT NULL"))
    assert rotated["previous_secret"].startswith("enc:v1:k1:")
    start_worker(encryption_key=KEYRING)
    await hooklane.publish(db, tenant="acme", type="order.paid", data={"who": "acme"})
    await hooklane.publish(db, tenant="globex", type="order.paid", data={"who": "globex"})
    (got,) = await wait_for(lambda: receiver.at("hooks"))
    for key in (SECRET, ROTATED):
        assert Webhook(key).verify(got.body, got.headers)["data"] == {"who": "globex"}

    # No secret, and no key, in the status, the Events or the operator's log.
    shown = [
        await kube.run("get", "whe", "orders-acme", "-o", "json"),
        await kube.run("get", "events", "-o", "json"),
        operator.output(),
    ]
    for text in shown:
        for value in (SECRET, ROTATED, KEY):
            assert value not in text and value.removeprefix("whsec_") not in text

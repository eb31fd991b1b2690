"""Self-service endpoints in Kubernetes mode, on a real kube-apiserver with
the operator running (``hooklane operator`` as a process), a real Postgres
and real receivers. The writer logs in as the chart's API ServiceAccount,
bound to the chart's portal Role only: what it does here is what the chart
grants."""

# The fixtures imported from other test modules are the tests' parameters.

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json
import logging
from pathlib import Path

import pytest
import yaml
from standardwebhooks.webhooks import Webhook

import hooklane
from hooklane.api.endpoint_writers import (
    MANAGED_BY,
    MANAGED_BY_LABEL,
    TENANT_LABEL,
    KubernetesWriter,
    make_writer,
)
from hooklane.api.errors import Refused
from hooklane.errors import InvalidInput
from hooklane.selfservice import SECRET_KEY, EndpointForm, resource_name, tenant_key
from hooklane.spec import API_VERSION, KIND
from testsupport.chart import INGEST_TOKEN
from testsupport.fixtures import in_process_api, wait_for
from testsupport.kube_fixtures import Kube, row
from testsupport.receivers import Answer


async def publish(db, tenant: str = "acme", **data) -> None:
    async with db.transaction():
        await hooklane.publish(db, tenant=tenant, type="order.created", data=data)


def as_user(control_plane, tmp_path: Path, name: str, token: str) -> Path:
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    config["users"][0]["user"] = {"token": token}
    path = tmp_path / f"{name}.kubeconfig"
    path.write_text(json.dumps(config))
    return path


@pytest.fixture
async def api_kubeconfig(kube, control_plane, tools, tmp_path) -> Path:
    """A kubeconfig of the chart's API ServiceAccount, with the chart's
    portal Role for the test's namespace, installed from the chart."""
    docs = tools.render(
        *("--set", "database.existingSecret=unused", "--set", f"api.tokens.ingest[0]={INGEST_TOKEN}"),
        *("--set", "portal.endpoints=kubernetes"),
        *("--show-only", "templates/serviceaccounts.yaml", "--show-only", "templates/api-portal-rbac.yaml"),
        release=("hooklane", kube.namespace),
    )
    assert [d["kind"] for d in docs if d["kind"] != "ServiceAccount"] == ["Role", "RoleBinding"]
    await kube.apply({"apiVersion": "v1", "kind": "List", "items": docs})
    token = (await kube.run("create", "token", "hooklane-api")).strip()
    return as_user(control_plane, tmp_path, "api", token)


def portal_settings(settings, namespace: str, **overrides):
    return dataclasses.replace(
        settings,
        portal_endpoints="kubernetes",
        portal_namespace=namespace,
        portal_https_only=False,
        portal_max_endpoints=3,
        **overrides,
    )


@pytest.fixture
def writer(api_kubeconfig, settings, connect, kube, monkeypatch) -> KubernetesWriter:
    monkeypatch.setenv("KUBECONFIG", str(api_kubeconfig))
    made = make_writer(portal_settings(settings, kube.namespace), connect)
    assert isinstance(made, KubernetesWriter)
    return made


async def secret_of(kube: Kube, name: str) -> dict | None:
    out = await kube.run("get", "secret", name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


async def secret_name(kube: Kube, endpoint: str) -> str:
    return (await kube.get(endpoint))["spec"]["secretRef"]["name"]


async def stored_secret(db, name: str, secret: str):
    found = await row(db, name)
    return found if found is not None and found["secret"] == secret else None


async def test_an_endpoint_made_in_the_portal_is_a_resource_the_operator_syncs_and_delivers(
    writer, kube, db, receiver, start_operator, start_worker
):
    start_operator()
    start_worker()
    url = receiver.on("hooks", Answer(204))
    created = await writer.create("acme", EndpointForm("orders", url, ("order.*",)))
    assert (created.namespace, created.name) == (kube.namespace, resource_name("acme", "orders"))

    body = await kube.get(created.name)
    assert body["metadata"]["labels"] == {MANAGED_BY_LABEL: MANAGED_BY, TENANT_LABEL: tenant_key("acme")}
    assert body["spec"]["tenant"] == "acme" and body["spec"]["url"] == url
    secret_name = body["spec"]["secretRef"]["name"]
    assert secret_name.startswith(created.name + "-") and body["spec"]["secretRef"]["key"] == SECRET_KEY
    secret = await secret_of(kube, secret_name)
    assert base64.b64decode(secret["data"][SECRET_KEY]).decode() == created.secret
    # Owned by the resource: Kubernetes' garbage collector deletes it with it.
    assert secret["metadata"]["ownerReferences"] == [
        {"apiVersion": API_VERSION, "kind": KIND, "name": created.name, "uid": body["metadata"]["uid"]}
    ]
    # What `kubectl get whe` shows, once the operator has written the
    # status columns (empty ones leave a row kubectl's columns cannot split).
    await wait_for(lambda: _columns_show_tenant(kube, created.name, "acme"))

    await wait_for(lambda: stored_secret(db, created.name, created.secret))
    await publish(db, order=1)
    (got,) = await wait_for(lambda: receiver.at("hooks"))
    assert Webhook(created.secret).verify(got.body, got.headers)["data"] == {"order": 1}


async def test_edit_pause_rotate_and_delete_reach_the_row(
    writer, kube, db, receiver, start_operator, start_worker
):
    start_operator()
    url = receiver.on("hooks", Answer(204))
    created = await writer.create("acme", EndpointForm("orders", "http://127.0.0.1:9/old", ("order.*",)))
    ns, name = created.namespace, created.name
    await wait_for(lambda: stored_secret(db, name, created.secret))

    assert (await kube.get(name))["spec"]["ordering"] == {"onDeadDelivery": "Hold"}
    assert await writer.update(
        "acme", ns, name, EndpointForm("orders", url, ("order.created",), 2, 3, "Skip")
    )

    async def edited():
        r = await row(db, name)
        return (
            r["url"],
            r["event_types"],
            r["max_concurrency"],
            r["timeout_seconds"],
            r["ordering_on_dead"],
        ) == (
            url,
            ["order.created"],
            2,
            3,
            "skip",
        )

    await wait_for(edited)
    assert (await kube.get(name))["spec"]["ordering"] == {"onDeadDelivery": "Skip"}
    with pytest.raises(InvalidInput) as caught:
        await writer.update("acme", ns, name, EndpointForm("renamed", url))
    assert caught.value.field == "name"

    assert await writer.set_paused("acme", ns, name, True)
    await wait_for(lambda: db.fetchval("SELECT paused FROM endpoints WHERE name = $1", name))
    assert (await kube.get(name))["spec"]["url"] == url, "a pause keeps the edit"
    assert await writer.set_paused("acme", ns, name, False)
    await wait_for(lambda: db.fetchval("SELECT NOT paused FROM endpoints WHERE name = $1", name))

    rotated = await writer.rotate_secret("acme", ns, name)
    assert rotated not in (None, created.secret)
    stored = await wait_for(lambda: stored_secret(db, name, rotated))
    assert stored["previous_secret"] == created.secret
    start_worker()
    await publish(db, order=2)
    (got,) = await wait_for(lambda: receiver.at("hooks"))
    Webhook(rotated).verify(got.body, got.headers)
    Webhook(created.secret).verify(got.body, got.headers)

    assert await writer.delete("acme", ns, name)
    await wait_for(lambda: _gone(db, kube, name))
    assert not await writer.delete("acme", ns, name)
    assert await writer.rotate_secret("acme", ns, name) is None


async def test_through_the_tenant_api_a_new_endpoint_is_a_resource_that_gets_deliveries(
    api_kubeconfig, settings, dsn, kube, db, receiver, start_operator, start_worker, monkeypatch
):
    """The tenant's own HTTP call, end to end: the API in Kubernetes mode
    writes the resource, the operator makes the row, a worker delivers."""
    monkeypatch.setenv("KUBECONFIG", str(api_kubeconfig))
    start_operator()
    start_worker()
    url = receiver.on("api-hooks", Answer(204))
    admin = {"Authorization": "Bearer admin-token-0123456789"}
    async with in_process_api(
        dsn, portal_settings(settings, kube.namespace), INGEST_TOKEN, "admin-token-0123456789"
    ) as api:
        issued = await api.post(
            "/v1/admin/portal-sessions",
            headers=admin,
            json={"tenant": "acme", "access": "manage", "kind": "token"},
        )
        tenant = {"Authorization": f"Bearer {(await issued.json())['token']}"}
        response = await api.post(
            "/v1/tenant/endpoints",
            headers=tenant,
            json={"name": "orders", "url": url, "event_types": ["order.*"]},
        )
        created = await response.json()
        assert response.status == 201, created
        assert (await kube.get(created["name"]))["spec"]["tenant"] == "acme"
        await wait_for(lambda: stored_secret(db, created["name"], created["secret"]))
        path = "/v1/tenant/endpoints/{namespace}/{name}".format(**created)
        assert (await api.get(path, headers=tenant)).status == 200
        await publish(db, order=3)
        (got,) = await wait_for(lambda: receiver.at("api-hooks"))
        assert Webhook(created["secret"]).verify(got.body, got.headers)["data"] == {"order": 3}
        assert (await api.delete(path, headers=tenant)).status == 204
        await wait_for(lambda: _gone(db, kube, created["name"]))


async def _columns_show_tenant(kube: Kube, name: str, tenant: str) -> bool:
    try:
        return (await kube.columns(name))["TENANT"] == tenant
    except ValueError:
        return False


async def _gone(db, kube: Kube, name: str) -> bool:
    return await row(db, name) is None and await kube.get(name) is None


async def test_another_tenants_or_a_hand_made_resource_is_as_if_it_did_not_exist(writer, kube, db):
    theirs = await writer.create("globex", EndpointForm("orders", "http://127.0.0.1:9/globex"))
    # acme's name, made by hand (GitOps): not the portal's to change.
    by_hand = resource_name("acme", "gitops")
    await kube.apply(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": by_hand},
            "spec": {
                "url": "http://127.0.0.1:9/x",
                "tenant": "acme",
                "secretRef": {"name": by_hand, "key": "secret"},
            },
        }
    )
    # acme's name and labels, globex's tenant (edited by hand).
    relabelled = await writer.create("acme", EndpointForm("moved", "http://127.0.0.1:9/moved"))
    read = await writer._owned("acme", kube.namespace, relabelled.name)
    await kube.run("patch", "whe", relabelled.name, "--type=merge", "-p", '{"spec": {"tenant": "globex"}}')
    # Given to another tenant between the writer's read and its write: the
    # write's tests (a JSON patch) leave it alone.
    assert not await writer._patch(read, "acme", {"paused": True})
    before = {n: (await kube.get(n))["spec"] for n in (theirs.name, by_hand, relabelled.name)}

    form = EndpointForm("orders", "http://127.0.0.1:9/acme")
    for name in (theirs.name, by_hand, relabelled.name, resource_name("acme", "missing")):
        assert not await writer.update("acme", kube.namespace, name, form)
        assert not await writer.set_paused("acme", kube.namespace, name, True)
        assert await writer.rotate_secret("acme", kube.namespace, name) is None
        assert not await writer.delete("acme", kube.namespace, name)
    # Another namespace is never the portal's.
    assert not await writer.delete("globex", "default", theirs.name)
    assert {n: (await kube.get(n))["spec"] for n in before} == before
    theirs_secret = await secret_of(kube, await secret_name(kube, theirs.name))
    assert base64.b64decode(theirs_secret["data"][SECRET_KEY]).decode() == theirs.secret


async def test_the_platforms_bounds_hold_the_resources_a_tenant_writes(writer, kube):
    with pytest.raises(InvalidInput) as caught:
        await writer.create("acme", EndpointForm("big", "http://127.0.0.1:9/x", max_concurrency=256))
    assert (caught.value.field, caught.value.message) == (
        "max_concurrency",
        "must be at most 4, the most this platform lets a tenant choose: not 256",
    )
    assert await kube.get(resource_name("acme", "big")) is None
    created = await writer.create("acme", EndpointForm("orders", "http://127.0.0.1:9/x", (), 4, 5))
    assert {k: (await kube.get(created.name))["spec"][k] for k in ("maxConcurrency", "timeoutSeconds")} == {
        "maxConcurrency": 4,
        "timeoutSeconds": 5,
    }
    # The platform raises it itself (kubectl, GitOps): no bound holds it,
    # and an edit of something else keeps it.
    await kube.run(
        "patch",
        "whe",
        created.name,
        "--type=merge",
        "-p",
        '{"spec": {"maxConcurrency": 16, "timeoutSeconds": 30}}',
    )
    kept = EndpointForm("orders", "http://127.0.0.1:9/new", (), 16, 30)
    assert await writer.update("acme", created.namespace, created.name, kept)
    with pytest.raises(InvalidInput) as caught:
        await writer.update(
            "acme", created.namespace, created.name, dataclasses.replace(kept, timeout_seconds=31)
        )
    assert caught.value.field == "timeout_seconds" and "at most 30" in caught.value.message
    spec = (await kube.get(created.name))["spec"]
    assert (spec["url"], spec["maxConcurrency"], spec["timeoutSeconds"]) == ("http://127.0.0.1:9/new", 16, 30)


async def test_a_tenant_gets_at_most_its_bound_even_at_once(writer, kube):
    forms = [EndpointForm(f"e{i}", "http://127.0.0.1:9/x") for i in range(6)]
    results = await asyncio.gather(*(writer.create("acme", f) for f in forms), return_exceptions=True)
    refused = [r for r in results if isinstance(r, Refused)]
    assert len(refused) == 3 and {(r.status, r.code) for r in refused} == {(409, "endpoint_limit")}, results
    listed = json.loads(
        await kube.run("get", "whe", "-l", f"{TENANT_LABEL}={tenant_key('acme')}", "-o", "json")
    )
    assert len(listed["items"]) == 3
    # Another tenant's count is its own; a name taken is said so.
    globex = await writer.create("globex", forms[0])
    with pytest.raises(Refused) as caught:
        await writer.create("globex", forms[0])
    assert (caught.value.status, caught.value.code, caught.value.field) == (409, "exists", "name")
    # No operator runs here, so no finalizer holds a deletion.
    assert await writer.delete("globex", globex.namespace, globex.name)
    await writer.create("globex", forms[0])


async def test_a_half_made_endpoint_gets_its_secret_at_rotation(writer, kube, db, start_operator):
    start_operator()
    created = await writer.create("acme", EndpointForm("orders", "http://127.0.0.1:9/x"))
    made = await secret_name(kube, created.name)
    await kube.run("delete", "secret", made)
    await wait_for(lambda: db.fetchval("SELECT secret IS NULL FROM endpoints WHERE name = $1", created.name))
    rotated = await writer.rotate_secret("acme", created.namespace, created.name)
    await wait_for(lambda: stored_secret(db, created.name, rotated))
    # A Secret the resource does not own is not rotated.
    await kube.run(
        "patch",
        "secret",
        made,
        "--type=json",
        "-p",
        '[{"op": "remove", "path": "/metadata/ownerReferences"}]',
    )
    with pytest.raises(Refused) as caught:
        await writer.rotate_secret("acme", created.namespace, created.name)
    assert (caught.value.status, caught.value.code) == (409, "conflict")


async def test_kubernetes_errors_are_clear_refusals(
    api_kubeconfig,
    kube,
    control_plane,
    settings,
    connect,
    tmp_path,
    monkeypatch,
    caplog,
):
    portal = portal_settings(settings, kube.namespace)
    form = EndpointForm("orders", "http://127.0.0.1:9/x")
    # Without the chart's Role: a token the API server refuses everything.
    await kube.run("create", "serviceaccount", "nobody")
    token = (await kube.run("create", "token", "nobody")).strip()
    monkeypatch.setenv("KUBECONFIG", str(as_user(control_plane, tmp_path, "nobody", token)))
    with caplog.at_level(logging.ERROR), pytest.raises(Refused) as caught:
        await make_writer(portal, connect).create("acme", form)
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    assert "403" in caplog.text and "forbidden" in caplog.text.lower()
    # An API server that cannot be reached.
    config = yaml.safe_load(Path(control_plane.kubeconfig).read_text())
    config["clusters"][0]["cluster"]["server"] = "https://127.0.0.1:9"
    (tmp_path / "closed.kubeconfig").write_text(json.dumps(config))
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "closed.kubeconfig"))
    with pytest.raises(Refused) as caught:
        await make_writer(portal, connect).set_paused(
            "acme", kube.namespace, resource_name("acme", "orders"), True
        )
    assert (caught.value.status, caught.value.code) == (503, "unavailable")
    # No credentials at all, or none that can be read.
    (tmp_path / "malformed.kubeconfig").write_text("current-context: nowhere\n")
    for path in ("missing.kubeconfig", "malformed.kubeconfig"):
        monkeypatch.setenv("KUBECONFIG", str(tmp_path / path))
        with pytest.raises(Refused) as caught:
            await make_writer(portal, connect).create("acme", form)
        assert caught.value.status == 503
    # Once the credentials are back, so is the writer.
    monkeypatch.setenv("KUBECONFIG", str(api_kubeconfig))
    assert await make_writer(portal, connect).create("acme", form)

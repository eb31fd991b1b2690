"""WebhookEventType resources against a real kube-apiserver and a real
Postgres, ``hooklane operator`` running as a process: what the API server
refuses, what the operator stores and says in status, and deletion.

The resources are cluster-scoped, so every name here is this module's own:
the control plane is the session's."""

from __future__ import annotations

import asyncio
import copy
import json
import re
from typing import Any

import asyncpg
import yaml

from hooklane import store
from hooklane.catalogue import load_manifests
from hooklane.crd import EVENTTYPE_PRINTER_COLUMNS
from testsupport.fixtures import wait_for
from testsupport.kube_fixtures import EXAMPLES, Kube

ORDER_PAID = EXAMPLES / "eventtypes" / "order-paid.yaml"


def _doc(resource: str, **spec: Any) -> dict[str, Any]:
    doc = yaml.safe_load(ORDER_PAID.read_text())
    doc["metadata"]["name"] = resource
    doc["spec"].update(spec)
    return doc


async def _get(kube: Kube, name: str) -> dict[str, Any] | None:
    out = await kube.run("get", "webhookeventtype", name, "-o", "json", "--ignore-not-found")
    return json.loads(out) if out.strip() else None


async def _ready(kube: Kube, name: str, reason: str, generation: int = 1) -> dict[str, Any] | None:
    body = await _get(kube, name) or {}
    ready = next((c for c in body.get("status", {}).get("conditions", []) if c["type"] == "Ready"), None)
    if ready is None or ready["reason"] != reason or ready.get("observedGeneration") != generation:
        return None
    return body


async def _columns(kube: Kube, name: str) -> dict[str, str]:
    """`kubectl get webhookeventtypes NAME`, by column: cut at the headers'
    offsets, as an empty cell leaves only spaces."""
    header, row = (await kube.run("get", "webhookeventtypes", name)).splitlines()
    starts = [m.start() for m in re.finditer(r"\S+", header)]
    ends = [*starts[1:], None]
    return {header[a:b].strip(): row[a:b].strip() for a, b in zip(starts, ends, strict=True)}


async def _versions(db: asyncpg.Connection, name: str) -> list[int]:
    rows = await db.fetch("SELECT version FROM catalogue_versions WHERE type = $1 ORDER BY version", name)
    return [r["version"] for r in rows]


async def _apply_error(kube: Kube, doc: dict[str, Any]) -> str:
    """What the API server says when it refuses ``doc``."""
    done = await asyncio.to_thread(kube.cp.kubectl, "apply", "-f", "-", stdin=json.dumps(doc), check=False)
    assert done.returncode != 0, done.stdout
    return done.stderr


async def test_kubectl_apply_stores_the_type_and_edits_and_deletion_follow(kube, db, start_operator):
    start_operator()
    await kube.run("apply", "-f", str(ORDER_PAID))

    body = await wait_for(lambda: _ready(kube, "order.paid", "Synced"))
    assert body["status"]["type"] == "order.paid" and body["status"]["latestVersion"] == 2
    assert "hooklane.io/finalizer" in body["metadata"]["finalizers"]
    row = await db.fetchrow("SELECT * FROM catalogue_types WHERE name = 'order.paid'")
    assert (row["type_group"], row["source"], row["deprecated_since"], row["archived"]) == (
        "Orders",
        "kubernetes",
        None,
        False,
    )
    (spec,) = load_manifests(ORDER_PAID.read_bytes(), "example")
    stored = await db.fetchval(
        "SELECT schema::text FROM catalogue_versions WHERE type = 'order.paid' AND version = 2"
    )
    assert json.loads(stored) == spec.versions[1].json_schema
    assert await _versions(db, "order.paid") == [1, 2]

    # kubectl get shows the name, then the CRD's printer columns.
    columns = await _columns(kube, "order.paid")
    assert list(columns) == ["NAME", *(c["name"].upper() for c in EVENTTYPE_PRINTER_COLUMNS)]
    assert [columns[c] for c in ("NAME", "TYPE", "GROUP", "LATEST", "DEPRECATED")] == [
        "order.paid",
        "order.paid",
        "Orders",
        "2",
        "",
    ]

    # Version 1 dropped, version 3 added, deprecated: stored in one go.
    edited = _doc("order.paid", deprecated={"since": "2026-09-30"})
    third = copy.deepcopy(edited["spec"]["versions"][1])
    third["version"] = 3
    edited["spec"]["versions"] = [edited["spec"]["versions"][1], third]
    await kube.apply(edited)
    body = await wait_for(lambda: _ready(kube, "order.paid", "Synced", generation=2))
    assert body["status"]["latestVersion"] == 3
    assert await _versions(db, "order.paid") == [2, 3]
    deprecated = await db.fetchval("SELECT deprecated_since FROM catalogue_types WHERE name = 'order.paid'")
    assert str(deprecated) == "2026-09-30"
    columns = await _columns(kube, "order.paid")
    assert (columns["LATEST"], columns["DEPRECATED"]) == ("3", "2026-09-30")

    # spec.name may change the type's case only (its resource name stays):
    # the old type gives way to the new one in one transaction.
    edited["spec"]["name"] = "Order.Paid"
    await kube.apply(edited)
    body = await wait_for(lambda: _ready(kube, "order.paid", "Synced", generation=3))
    assert body["status"]["type"] == "Order.Paid"
    assert [r["name"] for r in await db.fetch("SELECT name FROM catalogue_types")] == ["Order.Paid"]
    assert await _versions(db, "Order.Paid") == [2, 3]

    await kube.run("delete", "webhookeventtype", "order.paid", "--timeout=30s")
    assert await db.fetchval("SELECT count(*) FROM catalogue_types") == 0
    assert await db.fetchval("SELECT count(*) FROM catalogue_versions") == 0


async def test_invalid_types_are_refused_with_the_field_named(kube, db, start_operator):
    op = start_operator()
    # The API server refuses what the CRD's schema can say.
    bad_name = _doc("refund-issued", name="Refund Issued")
    assert "spec.name" in await _apply_error(kube, bad_name)
    other_name = _doc("refund-issued", name="Invoice_Sent")
    assert "metadata.name must be spec.name lowercased" in await _apply_error(kube, other_name)
    twice = _doc("refund-issued")
    twice["spec"]["versions"][1]["version"] = 1
    assert "spec.versions[1]: Duplicate value" in await _apply_error(kube, twice)
    zero = _doc("refund-issued")
    zero["spec"]["versions"][0]["version"] = 0
    assert "spec.versions[0].version" in await _apply_error(kube, zero)

    # The operator refuses what only a JSON Schema validator can tell, in
    # the Ready condition, and stores nothing.
    example = _doc("refund-issued", name="Refund_Issued")
    example["spec"]["versions"][1]["example"].pop("amount")
    await kube.apply(example)
    body = await wait_for(lambda: _ready(kube, "refund-issued", "InvalidSpec"))
    ready = body["status"]["conditions"][0]
    assert ready["status"] == "False"
    assert ready["message"] == "spec.versions[1].example: 'amount' is a required property"
    schema = _doc("refund-issued", name="Refund_Issued")
    schema["spec"]["versions"][0]["schema"]["properties"]["amount"]["$ref"] = (
        "https://schemas.example.com/a.json"
    )
    await kube.apply(schema)
    body = await wait_for(lambda: _ready(kube, "refund-issued", "InvalidSpec", generation=2))
    assert body["status"]["conditions"][0]["message"].startswith(
        "spec.versions[0].schema.properties.amount.$ref: 'https://schemas.example.com/a.json' is on the network"
    )
    assert await db.fetchval("SELECT count(*) FROM catalogue_types") == 0

    # A type of the same name applied in local mode is neither overwritten
    # nor deleted.
    (local,) = load_manifests(ORDER_PAID.read_bytes(), "example")
    local = local.model_copy(update={"name": "Refund_Issued", "description": "local"})
    await store.apply_event_type(db, local, store.EventTypeSource.LOCAL)
    await kube.apply(_doc("refund-issued", name="Refund_Issued"))
    body = await wait_for(lambda: _ready(kube, "refund-issued", "DeclaredLocally", generation=3))
    assert "hooklane eventtype delete Refund_Issued" in body["status"]["conditions"][0]["message"]
    await kube.run("delete", "webhookeventtype", "refund-issued", "--timeout=30s")
    row = await db.fetchrow("SELECT source, description FROM catalogue_types WHERE name = 'Refund_Issued'")
    assert (row["source"], row["description"]) == ("local", "local")
    assert "Traceback" not in op.output()

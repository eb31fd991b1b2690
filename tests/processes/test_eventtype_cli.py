"""Event types in local mode on a real Postgres: ``hooklane eventtype
apply``, ``list`` and ``delete`` as the command runs, and the store calls
behind them and behind the operator (one transaction per type, versions no
longer listed removed, one source never overwriting the other's)."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import yaml

from hooklane import store
from hooklane.catalogue import load_manifests
from testsupport.cli import hooklane

ORDER_PAID = Path(__file__).resolve().parents[2] / "examples" / "eventtypes" / "order-paid.yaml"

REFUND = textwrap.dedent(
    """\
    apiVersion: hooklane.io/v1alpha1
    kind: WebhookEventType
    metadata: {name: refund-issued}
    spec:
      name: Refund_Issued
      group: Refunds
      deprecated: {since: 2026-05-01}
      versions:
        - version: 1
          schema:
            type: object
            required: [amount]
            properties:
              amount: {$ref: "common/money.json#/$defs/amount"}
          example: {amount: 120}
    """
)

MONEY = {"$id": "https://example.com/money.json", "$defs": {"amount": {"type": "integer", "minimum": 0}}}


async def _versions(db, name: str) -> dict[int, tuple[dict, str]]:
    rows = await db.fetch(
        "SELECT version, schema::text AS schema, digest, md5(schema::text) AS wanted"
        " FROM catalogue_versions WHERE type = $1",
        name,
    )
    for r in rows:
        assert r["digest"] == r["wanted"]
    return {r["version"]: (json.loads(r["schema"]), r["digest"]) for r in rows}


def _write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


async def test_apply_list_and_delete(dsn, db, tmp_path):
    _write(tmp_path, "common/money.json", json.dumps(MONEY))
    manifests = _write(tmp_path, "types.yaml", ORDER_PAID.read_text() + "---\n" + REFUND)

    done = hooklane(dsn, "eventtype", "apply", "-f", str(manifests))
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines() == [
        "webhookeventtype order.paid created (latest version 2)",
        "webhookeventtype Refund_Issued created (latest version 1)",
    ]
    refund = await db.fetchrow("SELECT * FROM catalogue_types WHERE name = 'Refund_Issued'")
    assert (refund["type_group"], str(refund["deprecated_since"]), refund["source"]) == (
        "Refunds",
        "2026-05-01",
        "local",
    )
    # The file it refers to is bundled into $defs, its own $id dropped.
    schema = (await _versions(db, "Refund_Issued"))[1][0]
    assert schema["properties"]["amount"] == {"$ref": "#/$defs/money.json/$defs/amount"}
    assert schema["$defs"]["money.json"] == {"$defs": {"amount": {"type": "integer", "minimum": 0}}}
    assert sorted(await _versions(db, "order.paid")) == [1, 2]

    listed = hooklane(dsn, "eventtype", "list")
    assert [line.split() for line in listed.stdout.splitlines()] == [
        ["NAME", "GROUP", "LATEST", "VERSIONS", "DEPRECATED", "ARCHIVED", "SOURCE"],
        ["Refund_Issued", "Refunds", "1", "1", "2026-05-01", "no", "local"],
        ["order.paid", "Orders", "2", "2", "-", "no", "local"],
    ]

    # Version 1 dropped from the list: removed; version 2 unchanged: not written again.
    doc = yaml.safe_load(ORDER_PAID.read_text())
    before = await _versions(db, "order.paid")
    doc["spec"]["versions"] = doc["spec"]["versions"][1:]
    done = hooklane(dsn, "eventtype", "apply", "-f", "-", stdin=yaml.safe_dump(doc))
    assert done.stdout.splitlines() == [
        "webhookeventtype order.paid configured (latest version 2)",
        "  versions no longer listed, removed: 1",
    ]
    assert await _versions(db, "order.paid") == {2: before[2]}

    done = hooklane(dsn, "eventtype", "delete", "order.paid")
    assert (done.returncode, done.stdout) == (0, "webhookeventtype order.paid deleted\n")
    assert await db.fetchval("SELECT count(*) FROM catalogue_versions WHERE type = 'order.paid'") == 0
    again = hooklane(dsn, "eventtype", "delete", "order.paid")
    assert (again.returncode, again.stderr) == (1, "hooklane: no event type order.paid\n")


async def test_invalid_manifests_are_refused_with_the_field_named(dsn, db, tmp_path):
    doc = yaml.safe_load(ORDER_PAID.read_text())
    doc["spec"]["versions"][1]["example"].pop("amount")
    cases = [
        (yaml.safe_dump(doc), "spec.versions[1].example: 'amount' is a required property"),
        (
            REFUND,
            "spec.versions[0].schema.properties.amount.$ref: 'common/money.json#/$defs/amount': cannot read ",
        ),
        (
            REFUND.replace("common/money.json", "https://schemas.example.com/money.json"),
            "spec.versions[0].schema.properties.amount.$ref:"
            " 'https://schemas.example.com/money.json#/$defs/amount' is on the network:"
            " schemas are never fetched; copy it into $defs",
        ),
        (
            REFUND.replace("Refund_Issued", "Refund Issued"),
            "spec.name: must be an event type like 'order.paid' (letters, digits, '_' and '-',"
            " dot-separated), not 'Refund Issued'",
        ),
        (
            ORDER_PAID.read_text().replace("type: object", "type: objekt", 1),
            "spec.versions[0].schema.type: 'objekt' is not valid under any of the given schemas",
        ),
        (
            ORDER_PAID.read_text() + "---\n" + ORDER_PAID.read_text(),
            "--filename (document 2): declares order.paid a second time",
        ),
    ]
    for text, error in cases:
        done = hooklane(dsn, "eventtype", "apply", "-f", str(_write(tmp_path, "bad.yaml", text)))
        assert done.returncode == 2, text
        assert done.stderr.startswith(f"hooklane: {error}"), done.stderr
    assert await db.fetchval("SELECT count(*) FROM catalogue_types") == 0
    bad_name = hooklane(dsn, "eventtype", "delete", "order paid")
    assert (bad_name.returncode, bad_name.stderr) == (
        2,
        "hooklane: name: must be an event type like 'order.paid', not 'order paid'\n",
    )


async def test_one_source_never_overwrites_or_deletes_the_others(dsn, db):
    (spec,) = load_manifests(ORDER_PAID.read_bytes(), "example")
    applied = await store.apply_event_type(db, spec, store.EventTypeSource.KUBERNETES)
    assert (applied.created, applied.written_versions, applied.held_by) == (True, (1, 2), None)
    # The same spec again writes no version.
    again = await store.apply_event_type(db, spec, store.EventTypeSource.KUBERNETES)
    assert (again.created, again.written_versions, again.removed_versions) == (False, (), ())

    done = hooklane(dsn, "eventtype", "apply", "-f", str(ORDER_PAID))
    assert (done.returncode, done.stdout) == (2, "")
    assert "order.paid was applied from Kubernetes" in done.stderr
    done = hooklane(dsn, "eventtype", "delete", "order.paid")
    assert (done.returncode, done.stderr) == (
        2,
        "hooklane: order.paid was applied from Kubernetes (a WebhookEventType):"
        " delete it there (kubectl delete webhookeventtype order.paid)\n",
    )
    assert await db.fetchval("SELECT source FROM catalogue_types WHERE name = 'order.paid'") == "kubernetes"

    removed = await store.delete_event_type(db, "order.paid", store.EventTypeSource.KUBERNETES)
    assert removed == store.EventTypeRemoved(found=True)
    assert await db.fetchval("SELECT count(*) FROM catalogue_versions") == 0
    assert hooklane(dsn, "eventtype", "apply", "-f", str(ORDER_PAID)).returncode == 0
    held = await store.apply_event_type(db, spec, store.EventTypeSource.KUBERNETES)
    assert held == store.EventTypeApplied(held_by=store.EventTypeSource.LOCAL)
    removed = await store.delete_event_type(db, "order.paid", store.EventTypeSource.KUBERNETES)
    assert removed == store.EventTypeRemoved(found=False, held_by=store.EventTypeSource.LOCAL)
    assert await db.fetchval("SELECT source FROM catalogue_types WHERE name = 'order.paid'") == "local"

"""The endpoint field rules (``SPEC`` in hooklane/spec.py) against the
other places that enforce them: the API server, through the CRD written from
them, and Postgres' CHECK constraints, the database's backstop."""

from __future__ import annotations

import copy
import json
import uuid
from typing import Any

import asyncpg
import pytest

from hooklane.dev.controlplane import ControlPlane
from hooklane.errors import InvalidInput, StoreError
from hooklane.spec import API_VERSION, KIND, SPEC, FieldRule, parse_manifest, parse_spec

SPEC_ = {
    "url": "https://hooks.acme.example/orders",
    "tenant": "acme",
    "secretRef": {"name": "acme-webhook-secret", "key": "secret"},
}
LONG_URL = "https://hooks.acme.example/" + "x" * (2048 - len("https://hooks.acme.example/"))
LABELS = ".".join(["a" * 63] * 4)[:253]
Absent = object()


def _spec(path: str, value: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SPEC_)
    *parents, last = path.split(".")
    target = spec
    for part in parents:
        target = target[part]
    if value is Absent:
        del target[last]
    else:
        target[last] = value
    return spec


# (spec field, value, accepted): every bound and its neighbour past it,
# patterns, required fields, types and unknown fields.
ROWS: list[tuple[str, Any, bool]] = [
    ("maxConcurrency", 1, True),
    ("maxConcurrency", 0, False),
    ("maxConcurrency", 256, True),
    ("maxConcurrency", 257, False),
    ("maxConcurrency", None, True),
    ("maxConcurrency", "4", False),
    ("maxConcurrency", True, False),
    ("maxConcurrency", 4.5, False),
    ("timeoutSeconds", 1, True),
    ("timeoutSeconds", 0, False),
    ("timeoutSeconds", 60, True),
    ("timeoutSeconds", 61, False),
    ("timeoutSeconds", "5", False),
    ("paused", True, True),
    ("paused", "yes", False),
    ("paused", 1, False),
    ("url", LONG_URL, True),
    ("url", LONG_URL + "x", False),
    ("url", "", False),
    ("url", Absent, False),
    ("url", None, False),
    ("url", 7, False),
    ("url", "http://[::1]:8080/x?y=%20", True),
    ("url", "ftp://hooks.acme.example/", False),
    ("url", "hooks.acme.example/orders", False),
    ("url", "http:///orders", False),
    ("url", "http://hooks.acme.example/a b", False),
    ("url", "http://hooks.acme.example/\x1b[2J", False),
    ("url", "http://hooks.acme.example/orders\n", False),
    ("url", "http://hooks.acme.example/orders#frag", False),
    ("url", "http://user:pw@hooks.acme.example/", False),
    ("url", "http://token@hooks.acme.example/", False),
    ("tenant", "t", True),
    ("tenant", "t" * 253, True),
    ("tenant", "t" * 254, False),
    ("tenant", "", False),
    ("tenant", Absent, False),
    ("tenant", 7, False),
    ("tenant", "Acme Corp / EU", True),
    ("tenant", "ac\nme", False),
    ("tenant", "ac\x1bme", False),
    ("tenant", "ac\x7fme", False),
    ("tenant", "ac\x85me", False),
    ("tenant", "acmé", True),
    ("secretRef", Absent, False),
    ("secretRef", "acme-webhook-secret", False),
    ("secretRef.name", LABELS, True),
    ("secretRef.name", LABELS + "a", False),
    ("secretRef.name", "s" * 253, True),
    ("secretRef.name", "s" * 254, False),
    ("secretRef.name", "Acme_Secret", False),
    ("secretRef.name", "acme-", False),
    ("secretRef.name", "", False),
    ("secretRef.name", Absent, False),
    ("secretRef.key", "k" * 253, True),
    ("secretRef.key", "k" * 254, False),
    ("secretRef.key", "-._Key9", True),
    ("secretRef.key", "se cret", False),
    ("secretRef.key", "a/b", False),
    ("secretRef.key", "secret\n", False),
    ("secretRef.key", "", False),
    ("secretRef.key", Absent, False),
    ("secretRef.optional", True, False),
    ("eventTypes", [], True),
    ("eventTypes", None, True),
    ("eventTypes", ["*"], True),
    ("eventTypes", ["order.*", "invoice.paid", "a-b_c.d"], True),
    ("eventTypes", [f"type{i}" for i in range(64)], True),
    ("eventTypes", [f"type{i}" for i in range(65)], False),
    ("eventTypes", ["order." + "x" * 249], True),
    ("eventTypes", ["order." + "x" * 250], False),
    ("eventTypes", [""], False),
    ("eventTypes", ["order.**"], False),
    ("eventTypes", ["*.created"], False),
    ("eventTypes", ["order"], True),
    ("eventTypes", ["order.*\n"], False),
    ("eventTypes", ["order created"], False),
    ("eventTypes", "order.*", False),
    ("eventTypes", [7], False),
    ("colour", "blue", False),
]


def _manifest(namespace: str, spec: Any) -> dict[str, Any]:
    name = f"row-{uuid.uuid4().hex[:12]}"
    doc: dict[str, Any] = {"apiVersion": API_VERSION, "kind": KIND, "metadata": {"name": name}}
    doc["metadata"]["namespace"] = namespace
    if spec is not Absent:
        doc["spec"] = spec
    return doc


def _server_create(cp: ControlPlane, doc: dict[str, Any]) -> tuple[bool, Any]:
    """What `kubectl create` with server-side dry run and strict field
    validation says: (accepted, the defaulted object or the error)."""
    done = cp.kubectl(
        "create",
        "--dry-run=server",
        "--validate=strict",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(doc),
        check=False,
    )
    if done.returncode == 0:
        return True, json.loads(done.stdout)
    return False, done.stderr.strip()


def _parser(doc: dict[str, Any]) -> tuple[bool, Any]:
    try:
        return True, parse_manifest(doc)
    except InvalidInput as exc:
        return False, str(exc)


@pytest.fixture(scope="module")
def namespace(control_plane: ControlPlane) -> str:
    name = f"crd-agreement-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    return name


@pytest.mark.kube
def test_the_api_server_and_the_parser_agree_on_every_row(control_plane, namespace):
    docs = [_manifest(namespace, _spec(path, value)) for path, value, _ in ROWS]
    # Manifests beside the spec: none, an unknown top-level field.
    docs += [_manifest(namespace, Absent), {**_manifest(namespace, SPEC_), "sepc": {}}]
    expected = [accepted for _, _, accepted in ROWS] + [False, False]
    disagreements = []
    for doc, accepted in zip(docs, expected, strict=True):
        server, server_said = _server_create(control_plane, doc)
        parser, parsed = _parser(doc)
        if not server == parser == accepted:
            disagreements.append(
                f"{json.dumps(doc.get('spec'))[:160]}: server {server_said}, parser {parsed}"
            )
        elif accepted:
            # The server's defaults are the parser's.
            stored = server_said["spec"]
            assert parse_spec(namespace, doc["metadata"]["name"], stored) == parsed
            assert {k: stored[k] for k in ("maxConcurrency", "timeoutSeconds", "paused")} == {
                "maxConcurrency": parsed.max_concurrency,
                "timeoutSeconds": parsed.timeout_seconds,
                "paused": parsed.paused,
            }
    assert not disagreements, "\n".join(disagreements)


def _backed_rules() -> list[tuple[str, FieldRule]]:
    # Postgres has no CHECK on url, tenant or eventTypes.
    return [(key, rule) for key, rule in SPEC.properties.items() if rule.column is not None]


async def _insert(db: asyncpg.Connection, column: str | None = None, value: Any = None) -> str:
    """Insert an endpoint with ``column`` set to ``value``, or left to its
    default; its name."""
    name = f"ep-{uuid.uuid4().hex[:8]}"
    columns = ["namespace", "name", "tenant", "url", "partition"]
    values: list[Any] = ["default", name, "acme", "http://127.0.0.1:9/", 0]
    if column is not None:
        columns.append(column)
        values.append(value)
    placeholders = ", ".join(f"${i}" for i in range(1, len(values) + 1))
    async with db.transaction():
        await db.execute(f"INSERT INTO endpoints ({', '.join(columns)}) VALUES ({placeholders})", *values)
    return name


@pytest.mark.parametrize("key, rule", _backed_rules(), ids=[key for key, _ in _backed_rules()])
async def test_the_database_checks_the_same_bounds_and_defaults(db, key, rule):
    name = await _insert(db)
    assert await db.fetchval(f"SELECT {rule.column} FROM endpoints WHERE name = $1", name) == rule.default
    if rule.type != "integer":
        return
    for inside in (rule.minimum, rule.maximum):
        await _insert(db, rule.column, inside)
    for outside in (rule.minimum - 1, rule.maximum + 1):
        with pytest.raises(StoreError) as refused:
            await _insert(db, rule.column, outside)
        assert refused.value.sqlstate == "23514"  # check_violation

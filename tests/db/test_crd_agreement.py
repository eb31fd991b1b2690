"""The endpoint field rules (``SPEC`` in hooklane/spec.py) against
Postgres' CHECK constraints, the database's backstop. Against the API
server, through the CRD written from them: tests/kube/test_crd_agreement.py."""

from __future__ import annotations

import uuid
from typing import Any

import asyncpg
import pytest

from hooklane.errors import StoreError
from hooklane.spec import (
    ON_DEAD_DELIVERY,
    ORDERING,
    SPEC,
    FieldRule,
)


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


async def test_the_database_stores_on_dead_delivery_by_the_same_values_and_default(db):
    name = await _insert(db)
    stored = await db.fetchval("SELECT ordering_on_dead FROM endpoints WHERE name = $1", name)
    assert stored == ON_DEAD_DELIVERY[ORDERING.properties["onDeadDelivery"].default]
    for value in ON_DEAD_DELIVERY.values():
        await _insert(db, "ordering_on_dead", value)
    with pytest.raises(StoreError) as refused:
        await _insert(db, "ordering_on_dead", "Hold")
    assert refused.value.sqlstate == "23514"  # check_violation

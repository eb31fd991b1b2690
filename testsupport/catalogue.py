"""Catalogue rows written straight into Postgres, for the tests of what
reads the catalogue (the APIs, the portal, the OpenAPI export): what
writes them in production (the operator, ``hooklane eventtype apply``)
has tests of its own."""

from __future__ import annotations

import json
from datetime import date
from typing import Any

import asyncpg

# A type with a nested object, an array of objects, a $defs reference and
# an enum: what the portal's table and the export's lifting must handle.
ORDER_PAID_V1 = {
    "type": "object",
    "required": ["order_id", "amount"],
    "properties": {
        "order_id": {"type": "string", "description": "The order's id."},
        "amount": {"type": "integer", "minimum": 0, "description": "In cents."},
    },
}
ORDER_PAID_V2 = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["order_id", "amount", "currency", "customer"],
    "properties": {
        "order_id": {"type": "string", "description": "The order's id."},
        "amount": {"type": "integer", "minimum": 0, "description": "In the currency's smallest unit."},
        "currency": {"enum": ["EUR", "USD"], "description": "ISO 4217."},
        "customer": {
            "type": "object",
            "description": "Who paid.",
            "required": ["email"],
            "properties": {
                "email": {"type": "string", "format": "email", "description": "Where the receipt went."},
                "address": {"$ref": "#/$defs/address"},
            },
        },
        "items": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"sku": {"type": "string", "description": "Stock keeping unit."}},
            },
        },
    },
    "$defs": {
        "address": {
            "type": "object",
            "description": "A postal address.",
            "required": ["city"],
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
        }
    },
}
ORDER_PAID_V1_EXAMPLE = {"order_id": "ord_1", "amount": 1250}
ORDER_PAID_V2_EXAMPLE = {
    "order_id": "ord_2",
    "amount": 990,
    "currency": "EUR",
    "customer": {"email": "ana@example.com", "address": {"city": "Lisbon"}},
    "items": [{"sku": "tea-1"}],
}


async def add_catalogue_type(
    db: asyncpg.Connection,
    name: str,
    versions: list[tuple[Any, dict[str, Any]]],
    *,
    description: str = "",
    group: str | None = None,
    deprecated_since: date | None = None,
    archived: bool = False,
) -> None:
    """The type ``name`` with ``versions`` (schema, example), numbered from 1."""
    async with db.transaction():
        await db.execute(
            "INSERT INTO catalogue_types (name, description, type_group, deprecated_since, archived, source)"
            " VALUES ($1, $2, $3, $4, $5, 'local')",
            name,
            description,
            group,
            deprecated_since,
            archived,
        )
        for number, (schema, example) in enumerate(versions, start=1):
            text = json.dumps(schema)
            await db.execute(
                "INSERT INTO catalogue_versions (type, version, schema, example, digest)"
                " VALUES ($1, $2, $3::jsonb, $4::jsonb, md5($3::jsonb::text))",
                name,
                number,
                text,
                json.dumps(example),
            )


async def add_order_types(db: asyncpg.Connection) -> None:
    """A small catalogue: order.paid (two versions), order.refunded
    (deprecated), invoice.sent (archived), user.created (no group)."""
    await add_catalogue_type(
        db,
        "order.paid",
        [(ORDER_PAID_V1, ORDER_PAID_V1_EXAMPLE), (ORDER_PAID_V2, ORDER_PAID_V2_EXAMPLE)],
        description="An order was paid in full.",
        group="orders",
    )
    await add_catalogue_type(
        db,
        "order.refunded",
        [({"type": "object", "properties": {"order_id": {"type": "string"}}}, {"order_id": "ord_1"})],
        description="An order's payment was refunded.",
        group="orders",
        deprecated_since=date(2026, 6, 1),
    )
    await add_catalogue_type(
        db,
        "invoice.sent",
        [({"type": "object"}, {})],
        description="An invoice was mailed.",
        group="billing",
        archived=True,
    )
    await add_catalogue_type(
        db,
        "user.created",
        [({"type": "object", "properties": {"id": {"type": "integer"}}}, {"id": 1})],
        description="A user signed up.",
    )

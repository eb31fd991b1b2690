"""The admin and tenant APIs as tests call them: tokens, grants, a dead
delivery."""

from __future__ import annotations

import re
from typing import Any

import asyncpg
from aiohttp.test_utils import TestClient

import hooklane

ADMIN = "admin-token-0123456789"


INGEST = "ingest-token-0123456789"


ADMIN_AUTH = {"Authorization": f"Bearer {ADMIN}"}


# An address nothing listens on: deliveries stay pending or die, never sent.
NOWHERE = "http://127.0.0.1:9/hook"


async def grant(api: TestClient, tenant: str, access: str = "read", kind: str = "token") -> dict[str, Any]:
    response = await api.post(
        "/v1/admin/portal-sessions",
        headers=ADMIN_AUTH,
        json={"tenant": tenant, "access": access, "kind": kind},
    )
    body = await response.json()
    assert response.status == 201, body
    assert response.headers["Cache-Control"] == "no-store"
    return body


async def dead_delivery(db: asyncpg.Connection, tenant: str, name: str) -> str:
    """Publish an event of ``tenant`` and make its delivery to endpoint
    ``name`` dead, as a receiver answering 500 would: its id."""
    await hooklane.publish(db, tenant=tenant, type="order.paid", data={"t": tenant}, id=f"{tenant}-1")
    delivery = await db.fetchval(
        "UPDATE deliveries d SET state = 'dead', last_status = 500, last_error = 'HTTP 500' "
        "FROM endpoints ep WHERE ep.id = d.endpoint_id AND ep.name = $1 RETURNING d.id",
        name,
    )
    return str(delivery)


def filled(template: str, values: dict[str, str]) -> str:
    return _PARAMETER.sub(lambda m: values[m[1]], template)


_PARAMETER = re.compile(r"\{(\w+)\}")

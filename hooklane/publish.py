"""Publishing events: the transactional outbox call."""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import asyncpg

from hooklane.errors import InvalidInput
from hooklane.manifest import EVENT_TYPE
from hooklane.store.events import insert_event

_ID = re.compile(r"^[A-Za-z0-9_.:-]{1,255}$")
MAX_DATA_BYTES = 256 * 1024


def new_event_id() -> str:
    return "msg_" + uuid.uuid4().hex


def check_event(
    *, tenant: Any, type: Any, data: Any, id: Any = None, coalesce_key: Any = None
) -> str:
    """Check publish arguments; return ``data`` as JSON text."""
    if not isinstance(tenant, str) or not 1 <= len(tenant) <= 253:
        raise InvalidInput("tenant", "is required: a string of 1 to 253 characters")
    if not isinstance(type, str) or len(type) > 255 or not EVENT_TYPE.match(type):
        raise InvalidInput("type", f"must be a dotted event type like 'order.updated', not {type!r}")
    if not isinstance(data, dict):
        raise InvalidInput("data", "must be a JSON object")
    if id is not None and (not isinstance(id, str) or not _ID.match(id)):
        raise InvalidInput("id", "must be 1 to 255 characters of letters, digits and _.:-")
    if coalesce_key is not None and (not isinstance(coalesce_key, str) or not 1 <= len(coalesce_key) <= 255):
        raise InvalidInput("coalesce_key", "must be a string of 1 to 255 characters")
    try:
        data_json = json.dumps(data, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise InvalidInput("data", f"is not JSON-serialisable: {exc}") from None
    if len(data_json.encode()) > MAX_DATA_BYTES:
        raise InvalidInput("data", f"is larger than {MAX_DATA_BYTES} bytes")
    return data_json


async def publish(
    conn: asyncpg.Connection,
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
) -> str:
    """Publish an event inside the caller's transaction on ``conn``.

    The event and one delivery per matching endpoint commit or roll back with
    the caller's own writes. Returns the event id; publishing an id that is
    already stored stores nothing more and returns it again. An event that
    matches no endpoint is kept and counted, never dropped. ``coalesce_key``
    replaces a still-pending delivery of the same key to the same endpoint.
    """
    data_json = check_event(tenant=tenant, type=type, data=data, id=id, coalesce_key=coalesce_key)
    event_id = id or new_event_id()
    await insert_event(
        conn, id=event_id, tenant=tenant, type=type, data_json=data_json, coalesce_key=coalesce_key
    )
    return event_id

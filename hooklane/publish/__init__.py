"""Publishing events: the transactional outbox call.

The rules and the write are the database's (``hooklane_try_publish_v3``,
docs/publishing.md); each Python caller checks the arguments first, for
messages that quote the value and name the path in the data, and reads the
function's answer the same way. :func:`publish` here is asyncpg's;
:mod:`hooklane.publish.psycopg` and :mod:`hooklane.publish.sqlalchemy` have
the same for psycopg 3 and SQLAlchemy, sync and async."""

from __future__ import annotations

import math
import re
import uuid
from typing import Any

import asyncpg

from hooklane import store
from hooklane.checks import EVENT_TYPE, check_text, walk
from hooklane.errors import InvalidInput, shown
from hooklane.jsonb import jsonb_text, number_text
from hooklane.spec import check_tenant
from hooklane.traceparent import parse_traceparent
from hooklane.tracing import current_traceparent

_ID = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
# Of the data as stored and sent: jsonb's text (hooklane/jsonb.py), which a
# receiver gets byte for byte as the body's "data".
MAX_DATA_BYTES = 256 * 1024
# Integers every receiver can read back exactly: 64 bits, signed or unsigned.
# Most JSON parsers lose digits beyond that, or fail.
_INT_RANGE = (-(2**63), 2**64 - 1)
# hooklane_publish_refusal_v2's rule and words.
_ORDERING_KEY = re.compile(r"[\x20-\x7e]{1,255}")
ORDERING_KEY_RULE = "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"


def new_event_id() -> str:
    return "msg_" + uuid.uuid4().hex


def check_event(
    *,
    tenant: Any,
    type: Any,
    data: Any,
    id: Any = None,
    coalesce_key: Any = None,
    ordering_key: Any = None,
) -> str:
    """Check publish arguments; return ``data`` as JSON text, exactly as
    Postgres will print the stored jsonb, and so as a receiver gets it: the
    size limit holds for what is sent, whatever numbers the data holds.

    Everything is checked before any SQL: a statement Postgres refuses would
    abort the caller's transaction, and the caller's own writes with it."""
    check_tenant(tenant, "tenant")
    if not isinstance(type, str) or len(type) > 255 or not EVENT_TYPE.fullmatch(type):
        raise InvalidInput("type", f"must be a dotted event type like 'order.updated', not {shown(type)}")
    if not isinstance(data, dict):
        raise InvalidInput("data", "must be a JSON object")
    if id is not None and (not isinstance(id, str) or not _ID.fullmatch(id)):
        raise InvalidInput("id", "must be 1 to 255 characters of letters, digits and _.:-")
    if coalesce_key is not None:
        check_text(coalesce_key, "coalesce_key", 255)
    _check_data(data)
    data_json = jsonb_text(data)
    if len(data_json.encode()) > MAX_DATA_BYTES:
        raise InvalidInput("data", f"is larger than {MAX_DATA_BYTES} bytes")
    check_ordering_key(ordering_key)
    return data_json


def check_ordering_key(ordering_key: Any) -> None:
    """The function checks the ordering key after every other argument
    (``hooklane_publish_refusal_v2``): so does each caller, so that both
    name the same argument when several are wrong. It travels as a header,
    so it is kept to visible ASCII and spaces."""
    if ordering_key is not None and (
        not isinstance(ordering_key, str) or not _ORDERING_KEY.fullmatch(ordering_key)
    ):
        raise InvalidInput("ordering_key", ORDERING_KEY_RULE)


def _check_data(data: dict[str, Any]) -> None:
    """Refuse what JSON or jsonb cannot hold, before serialising. The walk
    stops once a lower bound on the size of jsonb's text passes the limit: a
    byte per value, and the characters of each key, string and number as
    jsonb prints it. So a huge or self-repeating tree costs no more to refuse
    than ``MAX_DATA_BYTES`` values, and the text rendered after the walk is
    a few times the limit at most (escapes, quotes and separators)."""
    budget = MAX_DATA_BYTES
    for path, node in walk(data, "data", field="data"):
        if isinstance(node, str):
            budget -= 1 + len(node)
        elif isinstance(node, dict):
            budget -= 1 + sum(len(key) for key in node)
        elif node is None or isinstance(node, (bool, list, tuple)):
            budget -= 1
        elif isinstance(node, int):
            if not _INT_RANGE[0] <= node <= _INT_RANGE[1]:
                raise InvalidInput("data", f"has an integer outside the 64-bit range at {path}")
            budget -= len(int.__repr__(node))
        elif isinstance(node, float):
            if not math.isfinite(node):
                raise InvalidInput("data", f"has {node} at {path}: JSON has no NaN or infinity")
            digits = number_text(node)
            # From 1e16 on, jsonb stores a float as the integer it denotes.
            if "." not in digits and not _INT_RANGE[0] <= int(digits) <= _INT_RANGE[1]:
                raise InvalidInput(
                    "data",
                    f"has {float.__repr__(node)} at {path}, which jsonb stores as an integer of "
                    f"{len(digits.lstrip('-'))} digits, outside the 64-bit range",
                )
            budget -= len(digits)
        else:
            raise InvalidInput("data", f"has a {node.__class__.__name__} at {path}, which is not JSON")
        if budget < 0:
            raise InvalidInput("data", f"is larger than {MAX_DATA_BYTES} bytes")


def arguments(
    *,
    tenant: Any,
    type: Any,
    data: Any,
    id: Any = None,
    coalesce_key: Any = None,
    traceparent: Any = None,
    ordering_key: Any = None,
) -> dict[str, Any]:
    """The publish function's arguments by name, checked (``InvalidInput``),
    ``data`` as its JSON text. The trace left out is the caller's current
    OpenTelemetry span's, of the application's own tracer provider."""
    data_json = check_event(tenant=tenant, type=type, data=data, id=id, coalesce_key=coalesce_key)
    if traceparent is None:
        traceparent = current_traceparent()
    else:
        parse_traceparent(traceparent, "traceparent")
    check_ordering_key(ordering_key)
    return {
        "tenant": tenant,
        "type": type,
        "data": data_json,
        "id": id,
        "coalesce_key": coalesce_key,
        "traceparent": traceparent,
        "ordering_key": ordering_key,
    }


async def publish(
    conn: asyncpg.Connection,
    *,
    tenant: str,
    type: str,
    data: dict[str, Any],
    id: str | None = None,
    coalesce_key: str | None = None,
    traceparent: str | None = None,
    ordering_key: str | None = None,
) -> str:
    """Publish an event inside the caller's transaction on ``conn``.

    The event and one delivery per matching endpoint commit or roll back with
    the caller's own writes. Returns the event id (made when ``id`` is
    None). An event is identified by (tenant, id): publishing the same event
    again (same id, type, data and coalesce_key) stores nothing more and
    returns the id again; the same id with other content raises
    ``EventConflict`` (an ``InvalidInput`` for ``id``), storing nothing and
    leaving the transaction usable. An event that matches no endpoint is
    kept and counted, never dropped. ``coalesce_key`` replaces a
    still-pending delivery of the same key to the same endpoint.
    ``traceparent`` (W3C) is the trace the event joins: each attempt's span
    is its child and the receiver gets it; left out, the caller's current
    OpenTelemetry span (of the application's own tracer provider) is.
    ``ordering_key`` (1 to 255 characters) orders the event's deliveries:
    each endpoint gets the events of one key one at a time, in the order
    their transactions committed; a second transaction publishing the same
    key waits for the first to commit (docs/publishing.md, "Ordering key").
    Publishing an id again under another ordering key is an
    ``EventConflict``.

    Raises ``InvalidInput`` (bad arguments, before any SQL),
    ``EventConflict`` and ``CatalogueRefused`` (an ``InvalidInput``: the
    event catalogue's check, docs/catalogue.md); none costs the
    transaction. Errors of the
    connection itself are left as ``conn`` raises them, as for the caller's
    own statements in the same transaction: asyncpg's on an application's
    connection (``CONNECTION_LOST`` in :mod:`hooklane.store.connection`
    lists those of a lost one), and ``hooklane.errors.StoreError`` on one
    from ``hooklane.store.connect``.
    """
    args = arguments(
        tenant=tenant,
        type=type,
        data=data,
        id=id,
        coalesce_key=coalesce_key,
        traceparent=traceparent,
        ordering_key=ordering_key,
    )
    stored = await store.insert_event(
        conn,
        id=id,
        tenant=tenant,
        type=type,
        data_json=args["data"],
        coalesce_key=coalesce_key,
        traceparent=args["traceparent"],
        ordering_key=ordering_key,
    )
    return stored.event_id

"""Opaque page cursors: a position in a listing, handed to the caller and
taken back. Base64url of a versioned text, so that callers treat it as a
token, and so that a change of listing order can refuse old cursors by
their version rather than misread them."""

from __future__ import annotations

import base64
import binascii
import re
from datetime import UTC, datetime, timedelta
from typing import NamedTuple

from hooklane.errors import InvalidInput

_MAX_CURSOR_CHARS = 1024
# The id part is an event id, or empty before the first event: anything else
# (a NUL, say) never came from a listing. hooklane.publish's rule, which
# imports the store, hence written here again (tests/unit/test_cursor.py checks
# that the two agree).
EVENT_ID = re.compile(r"[A-Za-z0-9_.:-]{1,255}")
_EVENTS = re.compile(rf"e1:([0-9]{{1,20}}):((?:{EVENT_ID.pattern})?)")
_DELIVERIES = re.compile(r"d1:([0-9]{1,19})")
_MAX_XID8 = 2**64 - 1
_MAX_BIGINT = 2**63 - 1


def _encode(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _decode(cursor: str, pattern: re.Pattern[str], field: str) -> re.Match[str]:
    refused = InvalidInput(field, "is not a cursor this listing returned")
    if len(cursor) > _MAX_CURSOR_CHARS:
        raise refused
    try:
        text = base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)).decode()
    except (binascii.Error, UnicodeDecodeError, ValueError):
        raise refused from None
    match = pattern.fullmatch(text)
    if match is None:
        raise refused
    return match


def event_cursor(xact: int, event_id: str) -> str:
    """The position after the event stored by transaction ``xact`` as ``event_id``."""
    return _encode(f"e1:{xact}:{event_id}")


def event_position(cursor: str | None, field: str = "cursor") -> tuple[int, str]:
    """(xact, id) of an :func:`event_cursor`; before every event for None."""
    if cursor is None:
        return 0, ""
    match = _decode(cursor, _EVENTS, field)
    xact = int(match[1])
    if xact > _MAX_XID8:
        raise InvalidInput(field, "is not a cursor this listing returned")
    return xact, match[2]


def delivery_cursor(delivery_id: int) -> str:
    """The position after delivery ``delivery_id`` in a newest-first listing."""
    return _encode(f"d1:{delivery_id}")


def delivery_position(cursor: str | None, field: str = "cursor") -> int | None:
    """The delivery id of a :func:`delivery_cursor`; None for the first page."""
    if cursor is None:
        return None
    delivery_id = int(_decode(cursor, _DELIVERIES, field)[1])
    if delivery_id > _MAX_BIGINT:
        raise InvalidInput(field, "is not a cursor this listing returned")
    return delivery_id


# The endpoint listing's position: the oldest pending delivery's created_at
# in microseconds since the epoch (empty for an endpoint with nothing
# pending), then the namespace and the name (DNS names: no colon in them).
_ENDPOINTS = re.compile(r"n1:(-?[0-9]{1,19})?:([a-z0-9-]{1,63}):([a-z0-9.-]{1,253})")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class EndpointPosition(NamedTuple):
    """Where an endpoint listing's page ends: its last endpoint's oldest
    pending delivery (None for nothing pending), namespace and name."""

    oldest_pending_at: datetime | None
    namespace: str
    name: str


def endpoint_cursor(position: EndpointPosition) -> str:
    """The position after ``position`` in the oldest-pending-first listing."""
    at = position.oldest_pending_at
    micros = "" if at is None else str((at - _EPOCH) // timedelta(microseconds=1))
    return _encode(f"n1:{micros}:{position.namespace}:{position.name}")


def endpoint_position(cursor: str | None, field: str = "cursor") -> EndpointPosition | None:
    """The position of an :func:`endpoint_cursor`; None for the first page."""
    if cursor is None:
        return None
    match = _decode(cursor, _ENDPOINTS, field)
    at = None
    if match[1] is not None:
        try:
            at = _EPOCH + timedelta(microseconds=int(match[1]))
        except OverflowError:
            raise InvalidInput(field, "is not a cursor this listing returned") from None
    return EndpointPosition(at, match[2], match[3])


# The attempt listing's position: the last attempt's recorded_at in
# microseconds since the epoch, its delivery id and attempt number.
_ATTEMPTS = re.compile(r"a1:(-?[0-9]{1,19}):([0-9]{1,19}):([0-9]{1,10})")


class AttemptPosition(NamedTuple):
    """Where an attempt listing's page ends: its last attempt's
    recorded_at, delivery id and attempt number."""

    recorded_at: datetime
    delivery_id: int
    attempt: int


def attempt_cursor(position: AttemptPosition) -> str:
    """The position after ``position`` in the newest-first attempt listing."""
    micros = (position.recorded_at - _EPOCH) // timedelta(microseconds=1)
    return _encode(f"a1:{micros}:{position.delivery_id}:{position.attempt}")


def attempt_position(cursor: str | None, field: str = "cursor") -> AttemptPosition | None:
    """The position of an :func:`attempt_cursor`; None for the first page."""
    if cursor is None:
        return None
    match = _decode(cursor, _ATTEMPTS, field)
    delivery_id, attempt = int(match[2]), int(match[3])
    if delivery_id > _MAX_BIGINT or attempt > 2**31 - 1:
        raise InvalidInput(field, "is not a cursor this listing returned")
    try:
        at = _EPOCH + timedelta(microseconds=int(match[1]))
    except OverflowError:
        raise InvalidInput(field, "is not a cursor this listing returned") from None
    return AttemptPosition(at, delivery_id, attempt)


# The catalogue listing's position: the last type's name (the catalogue's
# pattern of a type's name: no colon in it).
_CATALOGUE = re.compile(r"t1:([A-Za-z0-9_-]+(?:\.[A-Za-z0-9_-]+)*)")


def catalogue_cursor(name: str) -> str:
    """The position after the type ``name`` in the by-name listing."""
    return _encode(f"t1:{name}")


def catalogue_position(cursor: str | None, field: str = "cursor") -> str | None:
    """The type name of a :func:`catalogue_cursor`; None for the first page."""
    if cursor is None:
        return None
    return _decode(cursor, _CATALOGUE, field)[1]


# The held keys listing's position: the last key's held_since in
# microseconds since the epoch, then the key itself (1 to 255 printable
# ASCII characters: hooklane_publish_refusal_v2).
_HELD_KEYS = re.compile(r"k1:(-?[0-9]{1,19}):([\x20-\x7e]{1,255})")


class HeldKeyPosition(NamedTuple):
    """Where a held keys listing's page ends: its last key's held_since and
    the key."""

    held_since: datetime
    key: str


def held_key_cursor(position: HeldKeyPosition) -> str:
    """The position after ``position`` in the held-longest-first listing."""
    micros = (position.held_since - _EPOCH) // timedelta(microseconds=1)
    return _encode(f"k1:{micros}:{position.key}")


def held_key_position(cursor: str | None, field: str = "cursor") -> HeldKeyPosition | None:
    """The position of a :func:`held_key_cursor`; None for the first page."""
    if cursor is None:
        return None
    match = _decode(cursor, _HELD_KEYS, field)
    try:
        at = _EPOCH + timedelta(microseconds=int(match[1]))
    except OverflowError:
        raise InvalidInput(field, "is not a cursor this listing returned") from None
    return HeldKeyPosition(at, match[2])

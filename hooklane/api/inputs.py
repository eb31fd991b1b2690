"""The API's request rules, written once for ingest, the admin API and the
dashboard: an endpoint's key in the URL, delivery ids, times, page limits,
cursors and JSON bodies. Each refuses with :class:`~.errors.Refused` or
``InvalidInput`` naming the input, before a connection is taken, so that
a caller's mistake is a 4xx even while the database is away.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any

from aiohttp import web
from multidict import MultiMapping

from hooklane import store
from hooklane.api.errors import Refused
from hooklane.checks import check_name, check_namespace
from hooklane.errors import InvalidInput, shown
from hooklane.spec import check_tenant
from hooklane.store.cursor import endpoint_position, event_position
from hooklane.times import parse_time

# A body that has not arrived whole by then is refused: a client trickling
# bytes (slowloris) must not hold a connection and its buffer for long.
READ_TIMEOUT_SECONDS = 10.0
# An admin repair's body is a few ids or a time; the limit only bounds a
# wrong one.
ADMIN_MAX_BODY_BYTES = 256 * 1024
_MAX_LIMIT_DIGITS = 6
_EARLIEST = datetime.min.replace(tzinfo=UTC)

# --------------------------------------------------------------------------
# The URL and the query


def endpoint_key(request: web.Request) -> tuple[str, str]:
    """The (namespace, name) of the endpoint the URL names."""
    return (
        check_namespace(request.match_info["namespace"], "namespace"),
        check_name(request.match_info["name"], "name"),
    )


def delivery_id(text: str, field: str = "id") -> int:
    """A delivery id as a URL or a form holds it."""
    return store.check_delivery_id(text, field)


def required(query: Mapping[str, str], key: str) -> str:
    value = query.get(key)
    if value is None:
        raise InvalidInput(key, "is required")
    return value


def time(query: Mapping[str, str], key: str) -> datetime | None:
    """An optional RFC 3339 time parameter, in UTC."""
    value = query.get(key)
    return None if value is None else parse_time(value, key)


# An attempt listing walks the endpoint's history from ``until`` down to
# ``since`` (one partition a day), skipping what its filters leave out: the
# range is what bounds that walk when few attempts match, so it is bounded
# too, rather than a filter for a rare failure reading a month of attempts.
ATTEMPTS_BY_DEFAULT = timedelta(hours=1)
LONGEST_ATTEMPT_RANGE = timedelta(days=31)


def time_range(
    query: Mapping[str, str],
    *,
    default: timedelta = ATTEMPTS_BY_DEFAULT,
    longest: timedelta = LONGEST_ATTEMPT_RANGE,
    now: datetime | None = None,
) -> tuple[datetime, datetime]:
    """``since`` and ``until``: ``until`` ``now`` (this machine's when not
    given) and ``since`` ``default`` before it when left out; ``since``
    refused when it is not before ``until`` or lies more than ``longest``
    before it."""
    until = time(query, "until") or now or datetime.now(UTC)
    # Clamped: an ``until`` in the first hour of year 1 has no hour before it.
    since = time(query, "since") or max(until, _EARLIEST + default) - default
    if since >= until:
        raise InvalidInput("since", "must be before until (now when left out)")
    if until - since > longest:
        raise InvalidInput("since", f"must be at most {longest.days} days before until")
    return since, until


def answer_filter(query: Mapping[str, str]) -> tuple[store.StatusRange | None, str | None]:
    """``status`` and ``failure``: what an attempt got back, an HTTP status
    (or a class of them) or why there was none; any when left out."""
    return store.check_status_filter(query.get("status")), store.check_failure(query.get("failure"))


def values(query: MultiMapping[str], key: str) -> list[str] | None:
    """A parameter that may be repeated or hold a comma-separated list;
    None when left out."""
    return [v for value in query.getall(key, []) for v in value.split(",")] or None


def limit(query: Mapping[str, str], default: int) -> int:
    value = query.get("limit")
    if value is None:
        return default
    if not value.isascii() or not value.isdigit() or len(value) > _MAX_LIMIT_DIGITS:
        raise InvalidInput(
            "limit", f"must be a whole number between 1 and {store.MAX_PAGE}, not {shown(value)}"
        )
    return store.check_page(int(value))


def event_cursor(query: Mapping[str, str], key: str = "cursor") -> str | None:
    """An events listing's cursor, checked (and handed on as it came)."""
    value = query.get(key)
    event_position(value, key)
    return value


def delivery_cursor(query: Mapping[str, str], key: str = "cursor") -> str | None:
    """A deliveries listing's cursor, checked (and handed on as it came)."""
    value = query.get(key) or None
    store.delivery_position(value, key)
    return value


def attempt_cursor(query: Mapping[str, str], key: str = "cursor") -> str | None:
    """An attempt listing's cursor, checked (and handed on as it came)."""
    value = query.get(key) or None
    store.attempt_position(value, key)
    return value


def held_key_cursor(query: Mapping[str, str], key: str = "cursor") -> str | None:
    """A held keys listing's cursor, checked (and handed on as it came)."""
    value = query.get(key) or None
    store.held_key_position(value, key)
    return value


def endpoint_cursor(query: Mapping[str, str], key: str = "cursor") -> str | None:
    """An endpoint listing's cursor, checked (and handed on as it came)."""
    value = query.get(key) or None
    endpoint_position(value, key)
    return value


def flag(query: Mapping[str, str], key: str) -> bool:
    """A true/false parameter, false when left out."""
    value = query.get(key, "false")
    if value not in ("true", "false"):
        raise InvalidInput(key, f"must be true or false, not {shown(value)}")
    return value == "true"


def endpoint_filter(query: Mapping[str, str]) -> store.EndpointFilter:
    """Which endpoints a listing shows: ``tenant``, ``phase``,
    ``not_delivering`` (true/false) and ``name_prefix``; each left out (or
    empty, as a search form sends it) chooses all."""
    tenant = query.get("tenant") or None
    return store.EndpointFilter(
        tenant=None if tenant is None else check_tenant(tenant, "tenant"),
        name_prefix=store.check_name_prefix(query.get("name_prefix") or None, "name_prefix"),
        phase=store.check_phase(query.get("phase") or None, "phase"),
        not_delivering=flag(query, "not_delivering"),
    )


def tenant_filter(query: Mapping[str, str], tenant: str | None) -> store.EndpointFilter:
    """:func:`endpoint_filter` within one tenant's endpoints, whatever the
    query says: a tenant's listing; as the query says for the platform's
    (``tenant`` None)."""
    if tenant is None:
        return endpoint_filter(query)
    return replace(endpoint_filter({k: v for k, v in query.items() if k != "tenant"}), tenant=tenant)


# --------------------------------------------------------------------------
# Bodies


def check_media_type(content_type: str, charset: str | None) -> None:
    if content_type != "application/json":
        raise Refused(415, "unsupported_media_type", "the body must be application/json")
    if charset is not None and charset.lower() not in ("utf-8", "utf8"):
        raise Refused(415, "unsupported_media_type", "the body must be UTF-8 JSON, not " + charset)


def check_length(content_length: int | None, limit: int) -> None:
    if content_length is not None and content_length > limit:
        raise Refused(413, "too_large", f"the body is larger than {limit} bytes")


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    found = dict(pairs)
    if len(found) != len(pairs):
        # Parsers disagree on which of two equal keys wins: refused, so that
        # no receiver reads another event than the one checked here.
        raise ValueError(f"the key {json.dumps(_first_repeated(pairs))} appears twice in one object")
    return found


def _first_repeated(pairs: list[tuple[str, Any]]) -> str:
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            return key
        seen.add(key)
    raise AssertionError("no key repeats")


def parse_json(raw: bytes) -> dict[str, Any]:
    """The body as a JSON object; ``Refused`` (400 ``malformed``) for
    anything else."""
    value = json_value(raw)
    if not isinstance(value, dict):
        raise Refused(400, "malformed", "the body must be a JSON object")
    return value


def json_value(raw: bytes) -> Any:
    """The body as strict JSON: UTF-8, no NaN or Infinity, no key twice in
    an object; ``Refused`` (400 ``malformed``) otherwise."""
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise Refused(400, "malformed", f"the body is not UTF-8 (byte {exc.start})") from None
    try:
        value = json.loads(text, parse_constant=_no_constant, object_pairs_hook=_no_duplicates)
    except json.JSONDecodeError as exc:
        raise Refused(
            400, "malformed", f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}"
        ) from None
    except RecursionError:
        raise Refused(400, "malformed", "the body nests too deeply") from None
    except ValueError as exc:
        # Too many digits for an integer, NaN or Infinity, a duplicate key.
        raise Refused(400, "malformed", f"the body is not acceptable JSON: {exc}") from None
    return value


async def read_body(request: web.Request, limit: int) -> bytes:
    """The whole body, within ``limit`` bytes and ``READ_TIMEOUT_SECONDS``."""
    check_length(request.content_length, limit)
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            while size <= limit and (chunk := await request.content.read(limit + 1 - size)):
                chunks.append(chunk)
                size += len(chunk)
    except TimeoutError:
        raise Refused(408, "timeout", f"the body did not arrive within {READ_TIMEOUT_SECONDS:g} s") from None
    if size > limit:
        raise Refused(413, "too_large", f"the body is larger than {limit} bytes")
    return b"".join(chunks)


async def json_body(request: web.Request, *, required: bool, limit: int) -> dict[str, Any]:
    """A JSON object body, read as ingest reads one; {} when it may be left
    out and is."""
    if not request.can_read_body:
        if required:
            raise InvalidInput("body", "is required: a JSON object")
        return {}
    check_media_type(request.content_type, request.charset)
    value = json_value(await read_body(request, limit))
    if not isinstance(value, dict):
        raise InvalidInput("body", f"must be a JSON object, not {shown(value)}")
    return value

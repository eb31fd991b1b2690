"""The ingest routes: ``POST /v1/events`` and ``POST /v1/events/batch``.

A request is checked in this order, each step refusing before the next
costs anything: the token (the :mod:`.auth` middleware), the W3C
``traceparent`` header when there is one (400 naming it; ``tracestate`` is
ignored), the content type (415), the announced length (413, before
reading), the body as it is read (413 past ``api_max_body_bytes``; 408
when it trickles in slower than ``READ_TIMEOUT_SECONDS``), UTF-8 and JSON
(400), the fields (422 naming the field), the tenants the token may
publish for (403). Only then are the events committed, together with
other requests' (:mod:`.group_commit`), and 202 answered once COMMIT
returned. The events keep the trace context of the request's SERVER span
when the API is traced, else the producer's header as it came. A 503 says whether nothing was stored
(``unavailable``) or the COMMIT went unanswered (``outcome_unknown``, with
the ids to publish again).

The event checks are ``hooklane.publish.check_event``'s, the same the
library call makes.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from hooklane import metrics, tracing
from hooklane.api.auth import Audience, audience, expect_continue
from hooklane.api.context import SETTINGS, SHARES, deadline, grant, started
from hooklane.api.errors import RETRY_AFTER_SECONDS, Refused, problem
from hooklane.api.group_commit import Conflict, GroupCommitter
from hooklane.api.inputs import READ_TIMEOUT_SECONDS, check_length, check_media_type, parse_json
from hooklane.api.shares import Share
from hooklane.errors import CatalogueRefused, EventConflict, InvalidInput, OutcomeUnknown, StoreError
from hooklane.publish import check_event, new_event_id
from hooklane.store import Event
from hooklane.traceparent import parse_traceparent

logger = logging.getLogger(__name__)

EVENTS_PATH = "/v1/events"
BATCH_PATH = "/v1/events/batch"
COMMITTER = web.AppKey("committer", GroupCommitter)

# Committer tasks: each holds one connection for its transaction, and a few
# in turn keep the disk's flushes busy; the rest of the pool serves the
# admin routes.
MAX_COMMITTERS = 4
FIELDS = frozenset({"id", "type", "tenant", "data", "coalesce_key", "ordering_key"})
REQUIRED = ("type", "tenant", "data")


def add_routes(app: web.Application) -> None:
    """Add the ingest routes to ``app``, and the group committer that
    serves them to its startup and cleanup."""
    app.router.add_post(EVENTS_PATH, publish_one, expect_handler=expect_continue)
    app.router.add_post(BATCH_PATH, publish_batch, expect_handler=expect_continue)
    app.cleanup_ctx.append(_committer)


async def _committer(app: web.Application) -> AsyncIterator[None]:
    settings = app[SETTINGS]
    committer = GroupCommitter(
        app[SHARES].connect(Share.INGEST),
        committers=min(MAX_COMMITTERS, settings.api_pool_size - 1),
        max_events=max(settings.api_batch_max_events, 1000),
    )
    app[COMMITTER] = committer
    committer.start()
    yield
    await committer.stop()


# --------------------------------------------------------------------------
# Reading and checking: pure, apart from reading the body


def event_of(body: dict[str, Any], prefix: str = "") -> Event:
    """The event a request's object describes; ``InvalidInput`` naming the
    field, under ``prefix`` (``events[3].``) in a batch."""
    try:
        return _event_of(body)
    except InvalidInput as exc:
        raise InvalidInput(prefix + exc.field, exc.message) from None


def _event_of(body: dict[str, Any]) -> Event:
    for name in body:
        if name not in FIELDS:
            raise InvalidInput(name, f"is not a field of an event (those are {', '.join(sorted(FIELDS))})")
    for name in REQUIRED:
        if name not in body:
            raise InvalidInput(name, "is required")
    data_json = check_event(
        tenant=body["tenant"],
        type=body["type"],
        data=body["data"],
        id=body.get("id"),
        coalesce_key=body.get("coalesce_key"),
        ordering_key=body.get("ordering_key"),
    )
    return Event(
        id=body.get("id") or new_event_id(),
        tenant=body["tenant"],
        type=body["type"],
        data_json=data_json,
        coalesce_key=body.get("coalesce_key"),
        ordering_key=body.get("ordering_key"),
    )


def batch_of(body: dict[str, Any], max_events: int) -> list[Event]:
    for name in body:
        if name != "events":
            raise InvalidInput(name, "is not a field of a batch (it has `events` only)")
    events = body.get("events")
    if not isinstance(events, list) or not 1 <= len(events) <= max_events:
        raise InvalidInput("events", f"must be a list of 1 to {max_events} events")
    checked = []
    for index, event in enumerate(events):
        if not isinstance(event, dict):
            raise InvalidInput(f"events[{index}]", "must be an object")
        checked.append(event_of(event, f"events[{index}]."))
    return checked


def traceparent_header(request: web.Request) -> str | None:
    """The producer's W3C ``traceparent`` header, checked; ``Refused``
    (400 ``malformed``, naming it) when it is not one."""
    value = request.headers.get("traceparent")
    if value is None:
        return None
    try:
        return str(parse_traceparent(value, "traceparent"))
    except InvalidInput as exc:
        raise Refused(400, "malformed", f"the traceparent header {exc.message}", "traceparent") from None


def check_grant(request: web.Request, events: Sequence[Event], batch: bool) -> None:
    allowed = grant(request)
    for index, event in enumerate(events):
        if not allowed.allows(event.tenant):
            raise Refused(
                403,
                "forbidden",
                f"this token may not publish for tenant {event.tenant!r}",
                f"events[{index}].tenant" if batch else "tenant",
            )


@dataclass(frozen=True)
class Received:
    """A request's events, checked and allowed, not yet stored."""

    events: list[Event]
    batch: bool


async def receive(request: web.Request, *, batch: bool, traceparent: str | None = None) -> Received:
    """Everything before the commit: ``Refused`` or ``InvalidInput`` when
    the request is refused. The benchmark's ceiling serves this alone. The
    events are stored under ``traceparent``."""
    settings = request.config_dict[SETTINGS]
    check_media_type(request.content_type, request.charset)
    check_length(request.content_length, settings.api_max_body_bytes)
    try:
        async with asyncio.timeout(READ_TIMEOUT_SECONDS):
            raw = await request.read()
    except TimeoutError:
        raise Refused(408, "timeout", f"the body did not arrive within {READ_TIMEOUT_SECONDS:g} s") from None
    except web.HTTPRequestEntityTooLarge:
        # A chunked body, or one longer than announced, grew past the limit.
        raise Refused(
            413, "too_large", f"the body is larger than {settings.api_max_body_bytes} bytes"
        ) from None
    body = parse_json(raw)
    events = batch_of(body, settings.api_batch_max_events) if batch else [event_of(body)]
    check_grant(request, events, batch)
    if traceparent is not None:
        events = [dataclasses.replace(event, traceparent=traceparent) for event in events]
    return Received(events, batch)


# --------------------------------------------------------------------------
# The handlers


@audience(Audience.INGEST)
async def publish_one(request: web.Request) -> web.Response:
    return await _publish(request, batch=False)


@audience(Audience.INGEST)
async def publish_batch(request: web.Request) -> web.Response:
    return await _publish(request, batch=True)


async def _publish(request: web.Request, *, batch: bool) -> web.Response:
    try:
        parent = traceparent_header(request)
    except Refused as exc:
        return _refused(exc)
    if not tracing.enabled():
        return await _ingest(request, batch, parent)
    with tracing.ingest_span(BATCH_PATH if batch else EVENTS_PATH, parent) as span:
        response = await _ingest(request, batch, tracing.traceparent_of(span.get_span_context()))
        tracing.answered(span, response.status)
    return response


def _refused(exc: Refused | InvalidInput) -> web.Response:
    reason, response = refusal(exc)
    metrics.API_EVENTS_REFUSED.labels(reason).inc()
    return response


async def _ingest(request: web.Request, batch: bool, traceparent: str | None) -> web.Response:
    try:
        received = await receive(request, batch=batch, traceparent=traceparent)
    except (Refused, InvalidInput) as exc:
        return _refused(exc)
    try:
        # The deadline counts from the request's arrival: reading and
        # checking took part of it already.
        await request.config_dict[COMMITTER].commit(received.events, deadline(request))
    except Conflict as exc:
        field = f"events[{exc.index}].{exc.refusal.field}" if batch else exc.refusal.field
        if isinstance(exc.refusal, EventConflict):
            metrics.API_EVENTS_REFUSED.labels("conflict").inc()
            return problem(409, "conflict", exc.refusal.message, field=field)
        if isinstance(exc.refusal, CatalogueRefused):
            # The catalogue's check (docs/catalogue.md): the event, not a bug.
            metrics.API_EVENTS_REFUSED.labels("catalogue").inc()
            return problem(422, "invalid", exc.refusal.message, field=field)
        # The publish function refused what check_event passed: its rules
        # are the same (tests/db/test_publish_function.py), so this is a bug,
        # and still the input's refusal, nothing stored.
        logger.error("the publish function refused an event check_event passed: %s: %s", field, exc.refusal)
        metrics.API_EVENTS_REFUSED.labels("invalid").inc()
        return problem(422, "invalid", exc.refusal.message, field=field)
    except OutcomeUnknown as exc:
        metrics.API_EVENTS_REFUSED.labels("outcome_unknown").inc()
        logger.warning(
            "%s %s: the events may or may not be stored: %s",
            request.method,
            request.path,
            exc,
            extra={"action": "publish_outcome_unknown", "events": len(received.events)},
        )
        return outcome_unknown(received)
    except StoreError:
        metrics.API_EVENTS_REFUSED.labels("unavailable").inc()
        # Nothing was stored: the root middleware answers 503 with
        # Retry-After, and logs.
        raise
    metrics.API_ACK.observe(asyncio.get_running_loop().time() - started(request))
    metrics.API_EVENTS_ACCEPTED.inc(len(received.events))
    return accepted(received)


def refusal(exc: Refused | InvalidInput) -> tuple[str, web.Response]:
    """The reason (the label of ``hooklane_api_events_refused_total``) and
    the answer for a request :func:`receive` refused."""
    if isinstance(exc, Refused):
        return exc.code, problem(exc.status, exc.code, exc.detail, field=exc.field)
    return "invalid", problem(422, "invalid", exc.message, field=exc.field)


def outcome_unknown(received: Received) -> web.Response:
    """503 for events a COMMIT may have stored: the error body of
    :func:`.errors.problem`, and the ids, which a producer that let the API
    generate them needs to publish the same events again."""
    body = {
        "error": "outcome_unknown",
        "detail": "the database did not confirm the commit in time: the events may have been stored; "
        "publish them again with the same ids, which are stored once",
        "ids": [event.id for event in received.events],
    }
    return web.json_response(body, status=503, headers={"Retry-After": str(RETRY_AFTER_SECONDS)})


def accepted(received: Received) -> web.Response:
    ids = [event.id for event in received.events]
    return web.json_response({"ids": ids} if received.batch else {"id": ids[0]}, status=202)

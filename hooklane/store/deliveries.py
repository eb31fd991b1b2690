"""Deliveries: reservation, results, rescue and the endpoint lifecycle jobs."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from operator import itemgetter
from typing import Generic, NamedTuple, TypeVar

import asyncpg

from hooklane.errors import InvalidInput, shown
from hooklane.policies import CircuitPolicy
from hooklane.results import FailureClass, Recorded, Result, Verdict
from hooklane.store.cursor import delivery_cursor, delivery_position
from hooklane.store.events import check_page, check_time
from hooklane.store.queries import QUERIES

# A delivery's states (the CHECK constraint of deliveries.state).
STATES = ("pending", "sending", "delivered", "dead", "discarded")
FAILURES = tuple(f.value for f in FailureClass)
_STATUS = re.compile(r"([1-5])(xx|[0-9]{2})")
# How far ahead a rate-limited endpoint's starts are granted: a round
# grants what its bucket allows until then, each start with its wait, and
# the next comes half of it later, so that an endpoint at 100/s costs a
# few rounds a second rather than a hundred (the results its worker
# records bring some sooner: about 10 a second at 100/s). A worker that
# dies holds that much of the rate unused until its leases are rescued.
RATE_LOOKAHEAD_SECONDS = 1.0
# Between two raises of an adaptive endpoint's limit, and its hold when an
# overload comes back at a limit of 1 (HOOKLANE_ADAPTIVE_STEP_SECONDS).
ADAPT_STEP_SECONDS = 5.0


class Reserved(NamedTuple):
    """A delivery a round reserved, with what its call needs (the columns
    of hooklane_reserve_v8's delivery rows)."""

    id: int
    attempts: int  # with this one: the fence its result is recorded by
    created_at: datetime  # the start of its life (a resend starts a new one)
    endpoint_id: int
    namespace: str
    name: str
    url: str
    secret: str  # as stored (sealed)
    timeout_seconds: int
    event_id: str
    type: str
    data: str  # the event's JSON text
    event_created_at: datetime
    previous_secret: str | None  # the replaced secret while it still signs
    max_concurrency: int  # the limit in force (adaptive: the effective one)
    tenant: str
    traceparent: str | None
    start_at: datetime  # when the call may start, on the server's clock
    request_terms: str | None  # sealed
    max_attempts: int | None  # None: the settings'
    max_age_seconds: float | None  # None: the settings'
    rate_per_second: int | None
    ordering_key: str | None  # None: unordered
    ordering_seq: int | None  # its number among the key's deliveries to the endpoint


# Built once per row by name, in C: the reservation is the hot path.
_RESERVED = itemgetter(*Reserved._fields)


@dataclass(frozen=True)
class Reservation:
    """What a reservation round returns: the deliveries it reserved, each
    with its start on the server's clock (``start_at``), and one verdict per
    candidate endpoint, for the ready list. ``answered_at`` is the
    server's clock as it answered (None without candidates) and
    ``received`` this process's ``time.monotonic()`` when the answer
    arrived: a start's wait counts from the one here as from the other
    there."""

    deliveries: list[Reserved]
    verdicts: list[Verdict]
    answered_at: datetime | None
    received: float


async def reserve(
    conn: asyncpg.Connection,
    partitions: list[int],
    candidates: Sequence[int],
    floors: Sequence[datetime | None],
    limit: int,
    lease_grace_seconds: float,
    worker_id: str,
    lookahead_seconds: float = RATE_LOOKAHEAD_SECONDS,
    *,
    caps: Sequence[int | None] | None = None,
    apart: Sequence[bool] | None = None,
    tenant_ceiling: int | None = None,
) -> Reservation:
    """Reserve due deliveries of the ``candidates`` (endpoints of
    ``partitions``), reading each one's queue from its floor (None: from
    the start); each records ``worker_id`` as the worker that attempted it.
    A candidate with a cap (``caps``, one per candidate; None or a None
    cap: none) gets at most that many; those not ``apart`` (one per
    candidate, None: none; the worker's slow candidates, which it counts
    against its budget of long calls) up to ``limit`` in all, tenant
    first, then endpoint. A tenant's calls in flight, over every
    worker, never exceed ``tenant_ceiling`` (None: no ceiling). A
    rate-limited endpoint's starts are granted ``lookahead_seconds`` ahead
    at most, each with its time (``start_at``).
    Call only while this session holds those partitions' advisory locks."""
    if caps is not None and len(caps) != len(candidates):
        raise ValueError(f"{len(caps)} caps for {len(candidates)} candidates")
    if apart is not None and len(apart) != len(candidates):
        raise ValueError(f"{len(apart)} apart for {len(candidates)} candidates")
    if tenant_ceiling is not None and tenant_ceiling < 1:
        raise ValueError(f"tenant_ceiling must be at least 1, not {tenant_ceiling}")
    rows = await conn.fetch(
        *QUERIES["reserve"](
            partitions=partitions,
            candidates=list(candidates),
            floors=list(floors),
            caps=None if caps is None else list(caps),
            apart=None if apart is None else list(apart),
            limit=limit,
            lease_grace_seconds=lease_grace_seconds,
            worker_id=worker_id,
            lookahead_seconds=lookahead_seconds,
            tenant_ceiling=tenant_ceiling,
        )
    )
    received = time.monotonic()
    verdicts = [r for r in rows if r["id"] is None]
    return Reservation(
        [Reserved._make(_RESERVED(r)) for r in rows if r["id"] is not None],
        [Verdict.of(v) for v in verdicts],
        max((v["answered_at"] for v in verdicts), default=None),
        received,
    )


# A healthy endpoint's last delivery time is written at most this often:
# every other success in between leaves its row as it is, so that it gets a
# row version per step rather than one per batch of results (issue 21).
DELIVERED_STEP_SECONDS = 30.0


class Touched(NamedTuple):
    """An endpoint as a batch of results left it (hooklane_complete_v6's
    rows)."""

    id: int
    partition: int
    namespace: str
    name: str
    state: str
    paused_until: datetime | None  # its circuit's pause
    consecutive_failures: int
    deliverable: bool
    retried_head: datetime | None  # the earliest retry the batch queued
    opened: bool  # this batch opened its circuit
    deactivated: bool  # this batch deactivated it
    throttled_until: datetime | None  # an adaptive endpoint's hold
    effective_concurrency: int
    lowered: bool  # this batch lowered its adaptive limit
    # Its keys a publishing transaction held, left for the sweep (None: none).
    ordering_busy: list[str] | None

    def recorded(self) -> Recorded:
        # An adaptive endpoint's hold (a Retry-After, or a step at a limit
        # of 1) keeps it waiting as a pause does.
        held = [t for t in (self.paused_until, self.throttled_until) if t is not None]
        return Recorded(
            self.id, self.partition, bool(self.deliverable), max(held, default=None), self.retried_head
        )


_TOUCHED = itemgetter(*Touched._fields)


async def complete(
    conn: asyncpg.Connection,
    results: list[Result],
    circuit: CircuitPolicy,
    partitions: list[int],
    worker_id: str | None = None,
    adapt_step_seconds: float = ADAPT_STEP_SECONDS,
) -> list[Touched]:
    """Record results in one statement, each one's attempt with it (made by
    ``worker_id``); returns the endpoints touched as they left them. An
    adaptive endpoint's hold and limit change at most once per
    ``adapt_step_seconds``. Retries of endpoints outside ``partitions`` (the
    recording worker's) are notified to their owner. The keys of ordered
    results (``Result.ordered``) move on in the same transaction: the next
    delivery of each key whose head settled becomes due (its endpoint's
    ``retried_head``)."""
    now = datetime.now(UTC)
    ordered = [r.ordered for r in results if r.ordered is not None]
    rows = await conn.fetch(
        *QUERIES["complete"](
            ids=[r.delivery_id for r in results],
            attempts=[r.attempts for r in results],
            outcomes=[r.outcome for r in results],
            retry_ins=[r.retry_in for r in results],
            statuses=[r.status for r in results],
            errors=[r.error for r in results],
            failures=[r.failure for r in results],
            started_ats=[r.timing.started_at if r.timing else now for r in results],
            durations=[r.timing.duration if r.timing else None for r in results],
            retry_afters=[r.retry_after for r in results],
            trace_ids=[r.timing.trace_id if r.timing else None for r in results],
            worker_id=worker_id,
            threshold=circuit.threshold,
            step_seconds=circuit.step_seconds,
            cap_seconds=circuit.cap_seconds,
            partitions=partitions,
            delivered_step_seconds=DELIVERED_STEP_SECONDS,
            adapt_step_seconds=adapt_step_seconds,
            ordered_endpoints=[endpoint_id for endpoint_id, _ in ordered],
            ordered_keys=[key for _, key in ordered],
        )
    )
    return [Touched._make(_TOUCHED(r)) for r in rows]


async def purge_ordering_keys(conn: asyncpg.Connection, retention_seconds: float, batch: int = 1000) -> int:
    """Forget the ordering keys with nothing outstanding not published for
    ``retention_seconds``, a batch at a time; returns how many. Keys named
    after entities (an order's id) come and go: kept for ever, they would
    grow with every entity a platform ever had."""
    purged = 0
    while True:
        scanned, deleted = await conn.fetchrow(
            *QUERIES["purge_ordering_keys"](retention_seconds=retention_seconds, batch_size=batch)
        ) or (0, 0)
        purged += deleted
        if scanned < batch:
            return purged


async def advance_ordering(
    conn: asyncpg.Connection, keys: Sequence[tuple[int, str]]
) -> tuple[list[tuple[int, int, datetime]], list[tuple[int, str]]]:
    """Move on the (endpoint, key) ``keys`` whose head settled
    (hooklane_ordering_advance_v1, notifying the owner of each endpoint given
    a due delivery): the deliveries made due, as endpoint, partition and due
    time, and the keys a publishing transaction still holds."""
    rows = await conn.fetch(
        *QUERIES["ordering_advance"](endpoint_ids=[e for e, _ in keys], keys=[k for _, k in keys])
    )
    promoted = [(r["endpoint_id"], r["partition"], r["due"]) for r in rows if r["due"] is not None]
    return promoted, [(r["endpoint_id"], r["key"]) for r in rows if r["due"] is None]


@dataclass(frozen=True)
class Swept:
    """One page of the ordering sweep: each delivery it made due (endpoint,
    partition, key, due time), and the key the next page starts after
    (None: the walk reached the end)."""

    woken: list[tuple[int, int, str, datetime]]
    after: tuple[int, str] | None


async def sweep_ordering(
    conn: asyncpg.Connection,
    partitions: list[int],
    after: tuple[int, str] | None,
    page: int,
) -> Swept:
    """Move on the keys of ``partitions`` whose head settled without its
    key moving (hooklane_ordering_sweep_v2), among the ``page`` outstanding
    keys after ``after`` (None: from the first). Call only while this
    session holds those partitions' advisory locks."""
    row = await conn.fetchrow(
        *QUERIES["ordering_sweep"](
            partitions=partitions,
            after_endpoint=after[0] if after else None,
            after_key=after[1] if after else None,
            page=page,
        )
    )
    assert row is not None, "a function with OUT parameters returns one row"
    woken = list(
        zip(
            row["woken_endpoints"] or [],
            row["woken_partitions"] or [],
            row["woken_keys"] or [],
            row["woken_dues"] or [],
            strict=True,
        )
    )
    next_endpoint = row["next_endpoint"]
    return Swept(woken, None if next_endpoint is None else (next_endpoint, row["next_key"]))


@dataclass(frozen=True)
class Rescued:
    """Deliveries requeued by ``rescue_expired``: each one's endpoint,
    partition and due time; ``checked_at``, the database's time their
    leases were judged at."""

    checked_at: datetime
    endpoints: list[tuple[int, int, datetime]]


async def rescue_expired(
    conn: asyncpg.Connection, partitions: list[int], since: datetime | None = None
) -> Rescued:
    """Requeue deliveries whose lease ended from ``since`` on (None: any time).
    Call under the partitions' locks."""
    row = await conn.fetchrow(*QUERIES["rescue_expired"](partitions=partitions, since=since))
    assert row is not None, "an aggregate without GROUP BY returns one row"
    return Rescued(
        row["checked_at"], list(zip(row["endpoint_ids"], row["partitions"], row["dues"], strict=True))
    )


@dataclass(frozen=True)
class Listed:
    """What ``pending_endpoints`` read: (endpoint, partition, head) of each
    endpoint with pending deliveries; ``checked_at``, the database's time
    the queues were read at."""

    checked_at: datetime
    endpoints: list[tuple[int, int, datetime]]


async def pending_endpoints(
    conn: asyncpg.Connection,
    partitions: Sequence[int],
    since: datetime | None = None,
    whole: Sequence[int] = (),
) -> Listed:
    """Each deliverable endpoint of ``partitions`` with pending deliveries
    due from ``since`` on (None: any), its head the earliest of them: where
    a ready list starts from. The queues of the partitions in ``whole`` are
    read from their start, whatever ``since`` says."""
    row = await conn.fetchrow(
        *QUERIES["pending_endpoints"](partitions=list(partitions), since=since, whole=list(whole))
    )
    assert row is not None, "an aggregate without GROUP BY returns one row"
    return Listed(
        row["checked_at"],
        list(zip(row["endpoint_ids"], row["partitions"], row["heads"], strict=True)),
    )


@dataclass(frozen=True)
class Committed:
    """What ``published_since`` found: (endpoint, partition, due) of each
    endpoint with pending deliveries of the events committed since the
    snapshot it was given, how many events those were, and the snapshot
    to give the next call."""

    snapshot: str
    events: int
    endpoints: list[tuple[int, int, datetime]]


async def published_since(conn: asyncpg.Connection, since: str | None) -> Committed:
    """The endpoints given work by the events committed since ``since`` (a
    snapshot an earlier call returned; None: the first call, which finds
    nothing), in every partition."""
    row = await conn.fetchrow(*QUERIES["published_since"](since=since))
    assert row is not None, "an aggregate without GROUP BY returns one row"
    return Committed(
        row["snapshot"],
        row["events"],
        list(zip(row["endpoint_ids"], row["partitions"], row["dues"], strict=True)),
    )


async def hint_published(conn: asyncpg.Connection) -> None:
    """Tell the workers to probe now, when ``conn``'s transaction commits."""
    await conn.execute(*QUERIES["hint_published"]())


async def deactivate_failing(conn: asyncpg.Connection, after_seconds: float) -> list[asyncpg.Record]:
    return await conn.fetch(*QUERIES["deactivate_failing"](after_seconds=after_seconds))


# Deliveries one resend_dead or discard_dead statement changes at most:
# however many an endpoint has dead, no transaction holds more than this.
REPAIR_PAGE = 1000
# Events one replay_since statement pages through, and so the most
# deliveries it inserts: at 10,000 events a day, a replay of a month is 300
# statements of a few milliseconds each rather than one inserting 300,000
# rows in a transaction that holds them all until it ends.
REPLAY_PAGE = 1000

P = TypeVar("P")


@dataclass(frozen=True)
class Progress(Generic[P]):
    """How far a repair paged through an endpoint's rows got: how many it
    changed, and the position after its last page when it stopped before
    the end (None once it reached it). ``gone``: the endpoint went (deleted,
    or moved to another tenant) after its first page, which stopped it."""

    count: int
    stopped_at: P | None = None
    gone: bool = False


@dataclass(frozen=True)
class _Page(Generic[P]):
    count: int
    # Where the next page starts; None when this one was the last.
    after: P | None


def another_page_fits(now: float, stop_at: float | None, slowest: float) -> bool:
    """Whether a page may start at ``now`` and end by ``stop_at`` (None: no
    bound), judged by the slowest page so far, taken twice: a page's time
    varies with what it finds, and this one must not outlast the bound."""
    return stop_at is None or now + 2 * slowest <= stop_at


async def _paged(
    conn: asyncpg.Connection,
    page: Callable[[P], Awaitable[_Page[P] | None]],
    start: P,
    stop_at: float | None,
) -> Progress[P] | None:
    """Run ``page`` from ``start``, each page from where the previous one
    ended, until one is the last or the next might not end by ``stop_at``
    (on the event loop's clock). None when the endpoint is not there for
    the first page.

    A page still running at ``stop_at`` (the first, or one slower than the
    others) is cut off: the connection is closed, so that its statement
    ends on the server with it, and the position before it is where the
    repair stopped. Its statement rolls back, unless it committed as it was
    cut off: continuing then repeats it, which queues again those of its
    events that were delivered meanwhile, never one pending or in flight."""
    clock = asyncio.get_running_loop().time
    done, at, slowest, first = 0, start, 0.0, True
    while True:
        began = clock()
        try:
            async with asyncio.timeout_at(stop_at) as timer:
                found = await page(at)
        except TimeoutError:
            if not timer.expired():
                raise
            conn.terminate()
            return Progress(done, at)
        if found is None:
            return None if first else Progress(done, gone=True)
        first = False
        done += found.count
        if found.after is None:
            return Progress(done)
        at = found.after
        now = clock()
        slowest = max(slowest, now - began)
        if not another_page_fits(now, stop_at, slowest):
            return Progress(done, at)


async def resend_dead(
    conn: asyncpg.Connection, namespace: str, name: str, ids: list[int] | None = None
) -> int | None:
    """How many dead deliveries were queued again; None if there is no such endpoint."""
    done = await resend_dead_pages(conn, namespace, name, ids)
    return None if done is None else done.count


async def resend_dead_pages(
    conn: asyncpg.Connection,
    namespace: str,
    name: str,
    ids: list[int] | None = None,
    *,
    tenant: str | None = None,
    stop_at: float | None = None,
    page: int = REPAIR_PAGE,
) -> Progress[int] | None:
    """Queue again the endpoint's dead deliveries (``ids``, or all), ``page``
    of them a statement, each committing on its own outside a transaction,
    until none is left or the next page might not end by ``stop_at``
    (:func:`_paged`). Only while the endpoint is ``tenant``'s, when given,
    checked on every page. None if there is no such endpoint (of that
    tenant). A resend that stopped is continued by running it again: what
    it queued is no longer dead."""

    async def one(after: int) -> _Page[int] | None:
        async with conn.transaction():
            row = await conn.fetchrow(
                *QUERIES["resend_dead"](
                    namespace=namespace, name=name, tenant=tenant, ids=ids, after=after, page_size=page
                )
            )
            await _requeue_ordered(conn, row)
        return _repair_page(row, page)

    return await _paged(conn, one, 0, stop_at)


async def discard_dead(
    conn: asyncpg.Connection,
    namespace: str,
    name: str,
    ids: list[int] | None,
    by: str,
    *,
    stop_at: float | None = None,
    page: int = REPAIR_PAGE,
) -> Progress[int] | None:
    """Give up for good on dead deliveries of one endpoint (all, or ``ids``),
    recording ``by`` (who discarded them) in last_error, ``page`` of them a
    statement as :func:`resend_dead_pages`. None if there is no such
    endpoint."""

    async def one(after: int) -> _Page[int] | None:
        async with conn.transaction():
            row = await conn.fetchrow(
                *QUERIES["discard_dead"](
                    namespace=namespace, name=name, ids=ids, by=by, after=after, page_size=page
                )
            )
            if row is not None and row["ordered_endpoints"]:
                # A discarded head lets its key go on.
                await conn.fetch(
                    *QUERIES["ordering_advance"](
                        endpoint_ids=row["ordered_endpoints"], keys=row["ordered_keys"]
                    )
                )
        return _repair_page(row, page)

    return await _paged(conn, one, 0, stop_at)


async def _requeue_ordered(conn: asyncpg.Connection, row: asyncpg.Record | None) -> None:
    """Place the deliveries of ordered events a page set pending behind
    their keys, in its transaction (until then they wait, never due)."""
    if row is not None and row["ordered"]:
        await conn.fetch(*QUERIES["ordering_requeue"](ids=row["ordered"]))


def _repair_page(row: asyncpg.Record | None, page: int) -> _Page[int] | None:
    if row is None:
        return None
    return _Page(row["done"], row["last"] if row["scanned"] == page else None)


async def replay_since(
    conn: asyncpg.Connection, namespace: str, name: str, since: datetime, *, page: int = REPLAY_PAGE
) -> int | None:
    """How many events :func:`replay_pages` queued again, run to the end;
    None if there is no such endpoint."""
    done = await replay_pages(conn, namespace, name, since, page=page)
    return None if done is None else done.count


async def replay_pages(
    conn: asyncpg.Connection,
    namespace: str,
    name: str,
    since: datetime,
    *,
    tenant: str | None = None,
    after: tuple[int, str] = (0, ""),
    stop_at: float | None = None,
    page: int = REPLAY_PAGE,
) -> Progress[tuple[int, str]] | None:
    """Queue again, as new deliveries of the same event ids, every stored
    event of the endpoint's tenant created since ``since`` whose type it
    receives and that has no delivery to it pending or in flight now,
    whether or not it had one before (events published while it was
    deactivated are caught up). None if there is no such endpoint, or it is
    not ``tenant``'s when one is given.

    One statement per ``page`` events, in the order they were stored (xact,
    id), from the position ``after`` (an :func:`~hooklane.store.cursor.event_cursor`'s).
    Outside a transaction each commits on its own, and the worker starts
    sending the first while the next are queued. Each page checks that the
    endpoint is still the tenant's: one moved to another tenant stops the
    replay (``gone``). It stops too before a page that might not end by
    ``stop_at`` (:func:`_paged`), and says where: continuing from there
    queues each event once. Run again from the start instead, it queues only
    what is not pending or in flight (receivers deduplicate on webhook-id)."""
    check_time(since, "since")
    if tenant is None:
        tenant = await conn.fetchval(*QUERIES["endpoint_tenant"](namespace=namespace, name=name))
        if tenant is None:
            return None

    async def one(position: tuple[int, str]) -> _Page[tuple[int, str]] | None:
        async with conn.transaction():
            row = await conn.fetchrow(
                *QUERIES["replay_since"](
                    namespace=namespace,
                    name=name,
                    tenant=tenant,
                    since=since,
                    cursor_xact=str(position[0]),
                    cursor_id=position[1],
                    page_size=page,
                )
            )
            await _requeue_ordered(conn, row)
        if row is None:
            return None
        return _Page(row["replayed"], (int(row["xact"]), row["id"]) if row["scanned"] == page else None)

    return await _paged(conn, one, after, stop_at)


@dataclass(frozen=True)
class DeliveryView:
    """A delivery as the admin API and the dashboard list it."""

    id: int
    event_id: str
    event_type: str
    state: str
    attempts: int
    attempted_by: str | None
    # Its first creation, which a resend keeps; queued_at is when it was
    # last queued (its creation, or its latest resend), which its age, and
    # so its max age, counts from.
    created_at: datetime
    queued_at: datetime
    next_attempt_at: datetime | None  # when pending only
    delivered_at: datetime | None
    last_status: int | None
    # Without an HTTP answer to the last attempt: why (FailureClass).
    last_failure: str | None
    last_error: str | None
    # An ordered delivery's key and its number among the key's deliveries
    # to the endpoint (migration 0026); None for an unordered one.
    ordering_key: str | None = None
    ordering_seq: int | None = None

    @property
    def waiting_behind_key(self) -> bool:
        """Pending behind an earlier delivery of its key: it has no next
        attempt until that one settles."""
        return self.state == "pending" and self.ordering_key is not None and self.next_attempt_at is None

    @property
    def queued_again_at(self) -> datetime | None:
        """When a resend queued it again, the latest; None if never since
        its creation."""
        return self.queued_at if self.queued_at != self.created_at else None


def delivery_view(row: asyncpg.Record) -> DeliveryView:
    """A delivery as a listing or a lookup (delivery_of) read it."""
    return DeliveryView(
        row["id"],
        row["event_id"],
        row["event_type"],
        row["state"],
        row["attempts"],
        row["attempted_by"],
        row["created_at"],
        row["queued_at"],
        row["next_attempt_at"],
        row["delivered_at"],
        row["last_status"],
        row["last_failure"],
        row["last_error"],
        row["ordering_key"],
        row["ordering_seq"],
    )


@dataclass(frozen=True)
class DeliveryPage:
    deliveries: list[DeliveryView]
    # The next page's cursor; None when this page is the last.
    cursor: str | None


# Delivery ids are a bigserial: positive, within 63 bits.
MAX_DELIVERY_ID = 2**63 - 1


def check_delivery_id(text: str, field: str = "id") -> int:
    """A delivery id as a caller wrote it: digits naming a possible id."""
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not 1 <= int(text) <= MAX_DELIVERY_ID:
        raise InvalidInput(field, f"must be a delivery id (a positive whole number), not {shown(text)}")
    return int(text)


def check_among(values: Sequence[str] | None, known: Sequence[str], field: str) -> list[str] | None:
    """A filter of some of ``known`` (None: any): never empty, nothing else."""
    if values is None:
        return None
    unknown = [v for v in values if v not in known]
    if unknown or not values:
        raise InvalidInput(field, f"must be among {', '.join(known)}, not {shown(unknown or '')}")
    return list(values)


def check_states(states: Sequence[str] | None, field: str = "state") -> list[str] | None:
    return check_among(states, STATES, field)


@dataclass(frozen=True)
class StatusRange:
    """A status filter: one code (``503``) or a class (``5xx``)."""

    low: int
    high: int


def check_status_filter(text: str | None, field: str = "status") -> StatusRange | None:
    """A status filter as a caller wrote it: three digits, or a class as ``5xx``."""
    if text is None:
        return None
    match = _STATUS.fullmatch(text)
    if match is None:
        raise InvalidInput(field, f"must be an HTTP status (503) or a class of them (5xx), not {shown(text)}")
    if match[2] == "xx":
        low = int(match[1]) * 100
        return StatusRange(low, low + 99)
    return StatusRange(int(text), int(text))


def check_failure(text: str | None, field: str = "failure") -> str | None:
    if text is not None and text not in FAILURES:
        raise InvalidInput(field, f"must be among {', '.join(FAILURES)}, not {shown(text)}")
    return text


async def endpoint_deliveries(
    conn: asyncpg.Connection,
    namespace: str,
    name: str,
    *,
    states: Sequence[str] | None = None,
    since: datetime | None = None,
    until: datetime | None = None,
    status: StatusRange | None = None,
    failure: str | None = None,
    cursor: str | None = None,
    limit: int = 100,
) -> DeliveryPage | None:
    """A page of the endpoint's deliveries, newest first, of ``states``
    (all when None) created in [since, until), whose last attempt answered
    a status in ``status`` or failed with ``failure`` (each:
    any when None); None if there is no such endpoint."""
    rows = await conn.fetch(
        *QUERIES["endpoint_deliveries"](
            namespace=namespace,
            name=name,
            states=check_states(states),
            since=check_time(since, "since"),
            until=check_time(until, "until"),
            status_min=status.low if status else None,
            status_max=status.high if status else None,
            failure=check_failure(failure),
            before_id=delivery_position(cursor),
            limit=check_page(limit),
        )
    )
    if not rows:
        return None
    page = [delivery_view(r) for r in rows if r["id"] is not None]
    return DeliveryPage(page, delivery_cursor(page[-1].id) if len(page) == limit else None)


async def unrouted_events(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(*QUERIES["unrouted_events"]())


@dataclass(frozen=True)
class Unrouted:
    """Events of one tenant and type that matched no endpoint, kept."""

    tenant: str
    type: str
    events: int
    oldest: datetime
    newest: datetime


async def unrouted_counts(conn: asyncpg.Connection) -> list[Unrouted]:
    rows = await conn.fetch(*QUERIES["unrouted_counts"]())
    return [Unrouted(r["tenant"], r["type"], r["events"], r["oldest"], r["newest"]) for r in rows]


async def partition_count(conn: asyncpg.Connection) -> int:
    return await conn.fetchval(*QUERIES["partition_count"]())

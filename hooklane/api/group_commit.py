"""Group commit: concurrent publish requests share one transaction.

A commit with ``synchronous_commit`` on waits for the WAL to reach the disk,
and a request may be answered only after it: one transaction per request
would cap the API at the disk's flushes per second. Instead each request
queues a *unit* (its events and a future) and a few committer tasks each
take whatever queued while their previous commit ran (no artificial wait),
store it in one transaction and, once COMMIT returned, resolve every unit's
future. Under light load a unit is committed alone, at once; under heavy
load one flush acknowledges many requests.

A unit's outcome is its own: a batch is inserted inside a savepoint, so that
its conflict rolls back only it, and a single event's conflict stores
nothing and leaves the transaction usable (``store.insert_event``). When the
transaction itself fails every unit in it fails with it: nothing of theirs
is stored, except when the COMMIT was sent and its answer lost, the one case
where the outcome is unknown (a producer's retry with the same event id is
then stored once).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from hooklane import metrics, store
from hooklane.errors import EventConflict, StoreError, TransientStoreError

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Event:
    """An event checked by ``hooklane.publish.check_event``, ready to store."""

    id: str
    tenant: str
    type: str
    data_json: str
    coalesce_key: str | None


class Conflict(Exception):
    """Event ``index`` of a unit reuses an id for different content; nothing
    of the unit was stored."""

    def __init__(self, index: int, conflict: EventConflict) -> None:
        super().__init__(conflict.message)
        self.index = index
        self.conflict = conflict


@dataclass(eq=False)
class _Unit:
    events: Sequence[Event]
    future: asyncio.Future[None]
    # When its request gives up, on the event loop's clock.
    deadline: float
    # In a savepoint: a batch, stored whole or not at all.
    atomic: bool = field(init=False)

    def __post_init__(self) -> None:
        self.atomic = len(self.events) > 1


def take(queue: deque[_Unit], cap: int) -> list[_Unit]:
    """The units to commit together: the oldest, and those behind it while
    their events total at most ``cap``. Units already answered (their request
    gave up) are dropped on the way."""
    taken: list[_Unit] = []
    size = 0
    while queue:
        unit = queue[0]
        if unit.future.done():
            queue.popleft()
            continue
        if taken and size + len(unit.events) > cap:
            break
        taken.append(queue.popleft())
        size += len(unit.events)
    return taken


class GroupCommitter:
    """``committers`` tasks storing queued units on ``pool``, each
    transaction holding at most ``max_events`` events (a unit larger than
    that alone). A transaction is given until the last deadline of the
    requests it serves: once every one of them gave up, it is rolled back
    rather than committed behind their 503."""

    def __init__(self, pool: asyncpg.Pool, *, committers: int, max_events: int) -> None:
        self._pool = pool
        self._committers = committers
        self._max_events = max_events
        self._queue: deque[_Unit] = deque()
        self._wakeup = asyncio.Event()
        self._stopping = False
        self._tasks: list[asyncio.Task[None]] = []
        self.committing = 0

    @property
    def queued(self) -> int:
        """Units waiting for a committer."""
        return len(self._queue)

    def start(self) -> None:
        self._tasks = [
            asyncio.create_task(self._run(), name=f"committer-{i}") for i in range(self._committers)
        ]

    async def stop(self) -> None:
        """Commit what is queued, then stop."""
        self._stopping = True
        self._wakeup.set()
        await asyncio.gather(*self._tasks)

    async def commit(self, events: Sequence[Event], deadline: float) -> None:
        """Return once ``events`` are committed. ``Conflict`` when one reuses
        an id (nothing stored), ``TransientStoreError`` when the transaction
        failed, ``TimeoutError`` at ``deadline`` (the event loop's clock).
        Giving up before a committer took the unit stores nothing; after,
        the events may still commit with other requests' (the outcome is
        unknown, as when a COMMIT's answer is lost)."""
        if self._stopping:
            raise TransientStoreError("the API is shutting down")
        unit = _Unit(events, asyncio.get_running_loop().create_future(), deadline)
        self._queue.append(unit)
        self._wakeup.set()
        # Awaited directly, not shielded: a request that gives up cancels
        # its future, and a committer then skips the unit.
        async with asyncio.timeout_at(deadline):
            await unit.future

    async def _run(self) -> None:
        while True:
            units = take(self._queue, self._max_events)
            if not units:
                if self._stopping:
                    return
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            if self._queue:
                # Another committer may take the rest meanwhile.
                self._wakeup.set()
            self.committing += len(units)
            try:
                await self._commit(units)
            finally:
                self.committing -= len(units)

    async def _commit(self, units: list[_Unit]) -> None:
        try:
            async with asyncio.timeout_at(max(unit.deadline for unit in units)):
                outcomes = await self._store(units)
        except StoreError as exc:
            if not exc.transient and len(units) > 1:
                # Postgres refused a statement, not the transaction: one unit
                # at fault must not fail the others, so each goes alone.
                for unit in units:
                    await self._commit([unit])
                return
            _fail(units, str(exc), type(exc))
            return
        except TimeoutError:
            _fail(units, "every request gave up before the commit", TransientStoreError)
            return
        except Exception as exc:
            # A bug, not the database: its requests get 503 and the error
            # is logged with its traceback, but the committer lives on, or
            # every later request would wait for a committer that is gone.
            logger.exception("a group commit failed", extra={"action": "group_commit_error"})
            _fail(units, f"{type(exc).__name__}: {exc}", StoreError)
            return
        metrics.API_COMMIT_EVENTS.observe(sum(len(u.events) for u in units))
        for unit, outcome in zip(units, outcomes, strict=True):
            _settle(unit, outcome)

    async def _store(self, units: list[_Unit]) -> list[Conflict | None]:
        async with store.acquire(self._pool) as conn, conn.transaction():
            outcomes = await _insert_singles(conn, [u for u in units if not u.atomic])
            for unit in units:
                if unit.atomic:
                    outcomes[unit] = await _insert_batch(conn, unit)
        return [outcomes[unit] for unit in units]


def _fail(units: list[_Unit], reason: str, error: type[StoreError]) -> None:
    logger.warning(
        "a group of %d publish requests failed, nothing of theirs is stored: %s",
        len(units),
        reason,
        extra={"action": "group_commit_failed", "units": len(units)},
    )
    for unit in units:
        _settle(unit, error(f"the transaction failed: {reason}"))


async def _insert_singles(conn: asyncpg.Connection, units: list[_Unit]) -> dict[_Unit, Conflict | None]:
    # All in one round trip: a conflict stores nothing of its event and
    # leaves the transaction usable, so no savepoint is needed.
    conflicting = set(await store.insert_events(conn, [_row(unit.events[0]) for unit in units]))
    return {unit: _conflict(unit, 0) if i in conflicting else None for i, unit in enumerate(units)}


async def _insert_batch(conn: asyncpg.Connection, unit: _Unit) -> Conflict | None:
    # Rolling back to the savepoint undoes the batch's other events.
    savepoint = conn.transaction()
    await savepoint.start()
    conflicting = await store.insert_events(conn, [_row(event) for event in unit.events])
    if not conflicting:
        await savepoint.commit()
        return None
    await savepoint.rollback()
    return _conflict(unit, conflicting[0])


def _row(event: Event) -> store.EventRow:
    return (event.id, event.tenant, event.type, event.data_json, event.coalesce_key)


def _conflict(unit: _Unit, index: int) -> Conflict:
    event = unit.events[index]
    return Conflict(index, EventConflict(event.id, event.tenant))


def _settle(unit: _Unit, outcome: Exception | None) -> None:
    # A unit whose request gave up mid-transaction has a cancelled future.
    if unit.future.done():
        return
    if outcome is None:
        unit.future.set_result(None)
    else:
        unit.future.set_exception(outcome)

"""Group commit: concurrent publish requests share one transaction.

A commit with ``synchronous_commit`` on waits for the WAL to reach the disk,
and a request may be answered only after it: one transaction per request
would cap the API at the disk's flushes per second. Instead each request
queues a *unit* (its events and a future) and a few committer tasks each
take whatever queued while their previous commit ran (no artificial wait),
store it in one transaction and, once COMMIT returned, resolve every unit's
future. Under light load a unit is committed alone, at once; under heavy
load one flush acknowledges many requests. The transaction notifies the
workers once (``store.hint_published``) so that they probe for what it
stored at once; it is Hooklane's own, so PostgreSQL's notify lock, held by a
notifying transaction until its commit is flushed, orders only the API's
committers among themselves, never an application's transactions.

A unit's outcome is its own: a batch is inserted inside a savepoint, so that
its conflict rolls back only it, and a single event's conflict stores
nothing and leaves the transaction usable (``store.insert_event``). When the
transaction itself fails every unit in it fails with it, and what its
requests are told is what is known:

- a unit no committer took by its request's deadline is dropped, never to
  enter a transaction: nothing of it is stored;
- a unit a committer took is answered by its transaction, which is given
  until the earliest deadline of its units, so that each of their requests
  is answered by its own. When that passes before COMMIT was sent, the
  connection is closed (the server rolls back): nothing is stored. When it
  passes after, or COMMIT's answer is lost, the outcome is unknown
  (``OutcomeUnknown``): the events may be stored, and a producer's retry
  with the same ids is stored once.

Row locks are taken in one order, (tenant, id): the single events of a
group in one sorted statement, then each batch sorted, the batches in the
order of their first event, so that two batches over the same ids never
deadlock on them. An event with an ordering key is placed by (tenant,
key) instead, the row its publish locks (``ordering_keys``), and the sort
is stable: the events of one key keep the order they were accepted in,
which is the order they take the key's sequence numbers in. Moving a
batch behind the singles, or before another batch, could reorder a key's
events: a group stops before a unit that shares a key with a unit in it
when either is a batch, and that unit goes in the next group. Two
transactions can still wait on each other when their locks interleave
across those parts (each batch is locked whole before the next, and the
singles before every batch), on the pending delivery a coalesce key
replaces, or on ordering keys an application's transaction locks in
another order; Postgres then aborts one of them (a deadlock, after
``deadlock_timeout``), and the group is tried again after a short random
pause while its deadline allows: nothing of an aborted transaction is
stored.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

import asyncpg

from hooklane import metrics, store
from hooklane.api.shares import Connect
from hooklane.errors import (
    CatalogueRefused,
    DatabaseUnreachable,
    InvalidInput,
    OutcomeUnknown,
    StoreError,
    TransientStoreError,
)

logger = logging.getLogger(__name__)

# The SQLSTATEs of a transaction Postgres aborted so that another could go
# on: nothing of it is stored, and the same transaction tried again may
# commit. The values are the label of hooklane_api_commit_retries_total.
RETRIED = {"40P01": "deadlock", "40001": "serialization"}
# The pause before the group is tried again, doubling from the first and
# drawn at random from its upper half: the transaction Postgres let go on was woken by
# the abort and still has to take the locks it waited for, and a retry that
# took them back at once would close the same cycle again.
RETRY_PAUSE_SECONDS = 0.02
RETRY_PAUSE_CAP_SECONDS = 0.5


def retry_pause(tries: int, rng: random.Random | None = None) -> float:
    """Seconds to wait before the ``tries``-th retry (from 1)."""
    bound = min(RETRY_PAUSE_SECONDS * 2 ** (tries - 1), RETRY_PAUSE_CAP_SECONDS)
    return (rng or random).uniform(bound / 2, bound)


class Conflict(Exception):
    """The publish function refused event ``index`` of a unit (an
    ``EventConflict``: it reuses an id for different content); nothing of
    the unit was stored."""

    def __init__(self, index: int, refusal: InvalidInput) -> None:
        super().__init__(refusal.message)
        self.index = index
        self.refusal = refusal


@dataclass(eq=False)
class _Unit:
    events: Sequence[store.Event]
    future: asyncio.Future[None]
    # When its request gives up, on the event loop's clock.
    deadline: float
    # In a savepoint: a batch, stored whole or not at all.
    atomic: bool = field(init=False)
    # Taken by a committer: from then on its transaction answers it.
    taken: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        self.atomic = len(self.events) > 1


def take(queue: deque[_Unit], cap: int, now: float) -> list[_Unit]:
    """The units to commit together: the oldest, and those behind it while
    their events total at most ``cap`` and none shares an ordering key with
    a unit before it in the group when either is a batch (see the module's
    doc). Units whose request gave up, or whose deadline is past at ``now``
    (their request is about to), are dropped on the way: one would leave
    its group no time."""
    taken: list[_Unit] = []
    size = 0
    # The group's ordering keys, each with whether a batch holds it.
    keys: dict[tuple[str, str], bool] = {}
    while queue:
        unit = queue[0]
        if unit.future.done() or unit.deadline <= now:
            queue.popleft()
            continue
        ordered = _ordering_keys(unit)
        if taken and (
            size + len(unit.events) > cap or any(k in keys and (unit.atomic or keys[k]) for k in ordered)
        ):
            break
        unit.taken = True
        taken.append(queue.popleft())
        size += len(unit.events)
        for k in ordered:
            keys[k] = keys.get(k, False) or unit.atomic
    return taken


def _ordering_keys(unit: _Unit) -> set[tuple[str, str]]:
    return {(e.tenant, e.ordering_key) for e in unit.events if e.ordering_key is not None}


class GroupCommitter:
    """``committers`` tasks storing queued units on connections of
    ``connect``, each transaction holding at most ``max_events`` events (a
    unit larger than that alone). A transaction is given until the earliest deadline of the
    requests it serves, so that each of them is answered by its own."""

    def __init__(self, connect: Connect, *, committers: int, max_events: int) -> None:
        self._connect = connect
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

    async def commit(self, events: Sequence[store.Event], deadline: float) -> None:
        """Return once ``events`` are committed, by ``deadline`` (the event
        loop's clock). ``Conflict`` when one reuses an id (nothing stored),
        ``OutcomeUnknown`` when the COMMIT was not answered in time (the
        events may be stored), ``TransientStoreError`` when nothing was
        stored: the transaction failed, or no committer took the events
        before ``deadline``."""
        if self._stopping:
            raise TransientStoreError("the API is shutting down")
        unit = _Unit(events, asyncio.get_running_loop().create_future(), deadline)
        self._queue.append(unit)
        self._wakeup.set()
        try:
            # Shielded: once a committer took the unit, giving up here would
            # not take its events out of the transaction.
            async with asyncio.timeout_at(deadline):
                await asyncio.shield(unit.future)
            return
        except (TimeoutError, asyncio.CancelledError) as exc:
            if not unit.taken:
                # Cancelled, a committer skips it: it never reaches the database.
                unit.future.cancel()
                if isinstance(exc, asyncio.CancelledError):
                    raise
                raise TransientStoreError(
                    "no committer took the events before the request's deadline; nothing of them is stored"
                ) from None
            if isinstance(exc, asyncio.CancelledError):
                raise
        # Taken: the transaction is bounded by the earliest deadline of its
        # units, this one's at the latest, and answers at once when it passes.
        await asyncio.shield(unit.future)

    async def _run(self) -> None:
        while True:
            units = take(self._queue, self._max_events, asyncio.get_running_loop().time())
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
            outcomes = await self._store(units, min(unit.deadline for unit in units))
        except OutcomeUnknown as exc:
            _fail(units, str(exc), OutcomeUnknown)
            return
        except StoreError as exc:
            if not exc.transient and len(units) > 1:
                # Postgres refused a statement, not the transaction: one unit
                # at fault must not fail the others, so each goes alone.
                for unit in units:
                    await self._commit([unit])
                return
            _fail(units, str(exc), type(exc))
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

    async def _store(self, units: list[_Unit], bound: float) -> list[Conflict | None]:
        """The units' outcomes once committed by ``bound``, tried again
        while Postgres aborts the transaction for another's sake."""
        attempt = _Attempt()
        tries = 0
        try:
            async with asyncio.timeout_at(bound):
                while True:
                    attempt.committing = False
                    try:
                        return await self._attempt(units, attempt)
                    except TransientStoreError as exc:
                        reason = RETRIED.get(exc.sqlstate or "")
                        if reason is None:
                            raise
                        metrics.API_COMMIT_RETRIES.labels(reason).inc()
                        logger.info(
                            "a group of %d publish requests is tried again: %s",
                            len(units),
                            exc,
                            extra={"action": "group_commit_retry", "units": len(units), "reason": reason},
                        )
                        tries += 1
                        await asyncio.sleep(retry_pause(tries))
        except TimeoutError:
            if attempt.committing:
                raise OutcomeUnknown("COMMIT was sent and not answered by the earliest deadline") from None
            raise TransientStoreError("not committed by the earliest deadline of its requests") from None

    async def _attempt(self, units: list[_Unit], attempt: _Attempt) -> list[Conflict | None]:
        async with self._connect() as conn:
            try:
                return await _transaction(conn, units, attempt)
            except BaseException as exc:
                if not _rolled_back(conn, exc):
                    # Cancelled at the deadline, or cut off: a ROLLBACK could
                    # wait as long as the server stalls, and a closed
                    # connection makes the server roll back by itself.
                    conn.terminate()
                if attempt.committing and isinstance(exc, DatabaseUnreachable):
                    raise OutcomeUnknown(f"COMMIT was sent and its answer lost: {exc}") from exc
                raise


@dataclass
class _Attempt:
    # COMMIT was sent: from then on, an answer that does not come leaves
    # the outcome unknown.
    committing: bool = False


async def _transaction(
    conn: asyncpg.Connection, units: list[_Unit], attempt: _Attempt
) -> list[Conflict | None]:
    transaction = conn.transaction()
    await transaction.start()
    try:
        outcomes = await _insert_singles(conn, [u for u in units if not u.atomic])
        for unit in sorted((u for u in units if u.atomic), key=lambda u: min(map(_key, u.events))):
            outcomes[unit] = await _insert_batch(conn, unit)
        # The group's own transaction, not an application's: its one
        # notification has the workers probe for what it stored at once.
        await store.hint_published(conn)
    except StoreError as exc:
        if _answered(exc):
            # Postgres refused a statement and is there to roll back.
            await transaction.rollback()
        raise
    attempt.committing = True
    await transaction.commit()
    return [outcomes[unit] for unit in units]


def _answered(exc: BaseException) -> bool:
    """Whether Postgres answered with this error, the connection still usable."""
    return (
        isinstance(exc, StoreError) and exc.sqlstate is not None and not isinstance(exc, DatabaseUnreachable)
    )


def _rolled_back(conn: asyncpg.Connection, exc: BaseException) -> bool:
    return _answered(exc) and not conn.is_closed() and not conn.is_in_transaction()


def _fail(units: list[_Unit], reason: str, error: type[StoreError]) -> None:
    """Answer every unit with ``error``: an ``OutcomeUnknown`` may have been
    stored, any other stored nothing, and the log says which."""
    unknown = issubclass(error, OutcomeUnknown)
    logger.warning(
        "a group of %d publish requests %s: %s",
        len(units),
        "may or may not be stored" if unknown else "failed, nothing of theirs is stored",
        reason,
        extra={"action": "group_commit_unknown" if unknown else "group_commit_failed", "units": len(units)},
    )
    for unit in units:
        _settle(unit, error(reason if unknown else f"the transaction failed: {reason}"))


async def _insert_singles(conn: asyncpg.Connection, units: list[_Unit]) -> dict[_Unit, Conflict | None]:
    # All in one round trip: a refusal stores nothing of its event and
    # leaves the transaction usable, so no savepoint is needed. Stable: the
    # units are in the order they were accepted.
    ordered = sorted(units, key=lambda unit: _key(unit.events[0]))
    refused = await store.insert_events(conn, [unit.events[0] for unit in ordered])
    return {unit: Conflict(0, refused[i]) if i in refused else None for i, unit in enumerate(ordered)}


async def _insert_batch(conn: asyncpg.Connection, unit: _Unit) -> Conflict | None:
    # Stable: of two events under one id (and ordering key), the first in
    # the batch is stored and the second compared with it, as in the
    # batch's own order; the events of one ordering key keep it too.
    order = sorted(range(len(unit.events)), key=lambda i: _key(unit.events[i]))
    # Rolling back to the savepoint undoes the batch's other events.
    savepoint = conn.transaction()
    await savepoint.start()
    refused = await store.insert_events(conn, [unit.events[i] for i in order])
    if not refused:
        await savepoint.commit()
        return None
    await savepoint.rollback()
    # The rollback took the catalogue's refusal rows with it; the
    # transaction goes on, so they are counted as a single event's are.
    await store.record_catalogue_refusals(
        conn,
        [
            (unit.events[order[p]].tenant, unit.events[order[p]].type, r)
            for p, r in sorted(refused.items())
            if isinstance(r, CatalogueRefused)
        ],
    )
    first = min(refused, key=lambda position: order[position])
    return Conflict(order[first], refused[first])


def _key(event: store.Event) -> tuple[str, int, str]:
    # The order row locks are taken in: the primary key of events, or for
    # an ordered event its key's rows in ordering_keys (which a second
    # publish of the key waits on until the first commits).
    if event.ordering_key is not None:
        return (event.tenant, 0, event.ordering_key)
    return (event.tenant, 1, event.id)


def _settle(unit: _Unit, outcome: Exception | None) -> None:
    if outcome is None:
        unit.future.set_result(None)
    else:
        unit.future.set_exception(outcome)

"""The worker process: reserve under the partition locks, send, record.

Tasks, all in one event loop:
- the reservation loop, woken by its trigger (hooklane/worker/trigger.py)
  and when the ready list (hooklane/worker/ready.py) says an endpoint is
  due: each round visits only the endpoints whose time has come;
- one task per delivery in flight, each in a quick slot or, once it runs
  long, in the long budget (hooklane/worker/slots.py);
- the recorder, which writes results in batches (one statement per batch);
- the background jobs (hooklane/worker/jobs.py): the rebalancer, which
  keeps this worker's fair share of partitions, maintenance (rescue,
  deactivation, retention), the ready sweep and the per-endpoint gauges.
If any background task dies, the worker stops rather than limping on.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import gc
import logging
import resource
import time
from datetime import UTC, datetime
from urllib.parse import urlsplit

import asyncpg
from opentelemetry.trace import Span, SpanContext

from hooklane import metrics, store, tracing
from hooklane.errors import InvalidInput, SchemaMissing, StoreError, TransientStoreError
from hooklane.policies import CircuitPolicy
from hooklane.results import FailureClass, Timing
from hooklane.secrets import owner, terms_owner, unseal
from hooklane.settings import Settings
from hooklane.signing import event_body, parse_secret
from hooklane.worker.commits import CommitProbe
from hooklane.worker.jobs import (
    CallGauges,
    Gauges,
    HorizonWatch,
    Job,
    Maintenance,
    ReadySweep,
    Rebalancer,
    run_every,
)
from hooklane.worker.partitions import LostOwnership, PartitionOwner
from hooklane.worker.ready import ReadyList, Wakeup
from hooklane.worker.rules import (
    Attempt,
    Dead,
    Outcome,
    Paced,
    Retry,
    classify,
    endpoint_policy,
    granted_here,
    paced_start,
    past_lease,
    result_of,
)
from hooklane.worker.sender import Sender
from hooklane.worker.slots import HURRIED_SHARE, LONG_OVERDRAFT, Call, Slots
from hooklane.worker.terms import TermsCache
from hooklane.worker.trigger import Trigger

logger = logging.getLogger(__name__)

# An ordered delivery a stalled worker would have started after its lease
# allows (past_lease): not sent, and due again at once.
LATE_ERROR = "not sent: the worker was too late for the delivery's lease"

_RECORD_BATCH = 500
# Results wait up to this long to share one `complete`: a call costs Postgres
# about 0.7 ms whatever it records and a result about 0.05 ms more (issue 12,
# docs/benchmarks.md section 5), and at an everyday rate results come one by
# one. The wait adds no latency, as the receiver has the delivery already;
# but an unrecorded result still holds its endpoint's slot in Postgres, so
# one whose endpoint this worker holds at its limit is written at once
# (Worker._record_loop).
_RECORD_INTERVAL = 0.1

# Open files beyond the calls' sockets: Postgres connections, the metrics
# server, logs, the event loop's own.
_SPARE_FILES = 64

# When a reservation answered: the database's clock then, and this
# process's monotonic clock as the answer arrived (rules.granted_here).
Answer = tuple[datetime, float]


async def _keep_session(_conn: asyncpg.Connection) -> None:
    """The worker pool's reset on release. asyncpg rolls back a transaction
    left open before calling it; its default reset then undoes, in one more
    round trip per release, what the worker's pooled sessions never do (SET,
    LISTEN, session advisory locks, cursors held past a transaction: those
    live on the lock connection, PartitionOwner). At an everyday rate that
    round trip came with every batch of results."""


class Worker:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.trigger = Trigger(settings.worker_concurrency)
        self._stopping = asyncio.Event()
        self._sending: set[asyncio.Task] = set()
        self.slots = Slots(settings.worker_concurrency, _long_calls_allowed(settings))
        self.ready_list = ReadyList()
        # The partitions the ready list was built for, and under which lock
        # connection (PartitionOwner.generation).
        self._listed: set[int] = set()
        self._listed_generation = 0
        self._results: asyncio.Queue[store.Result | None] = asyncio.Queue()
        self._owner: PartitionOwner | None = None
        self._pool: asyncpg.Pool | None = None
        self._probe: CommitProbe | None = None
        self._sender: Sender | None = None
        self._keys: dict[str, bytes] = {}
        self._terms = TermsCache(settings.encryption_key)
        # Each rate-limited endpoint's latest start here (rules.paced_start).
        self._paced: dict[int, Paced] = {}

    # Set by ``_start``, before any of the loops that use them runs.
    @property
    def owner(self) -> PartitionOwner:
        assert self._owner is not None, "used before _start"
        return self._owner

    @property
    def pool(self) -> asyncpg.Pool:
        assert self._pool is not None, "used before _start"
        return self._pool

    @property
    def probe(self) -> CommitProbe:
        assert self._probe is not None, "used before _start"
        return self._probe

    @property
    def sender(self) -> Sender:
        assert self._sender is not None, "used before run"
        return self._sender

    def ready(self) -> bool:
        """Connected, holding its share of the partitions (or knowing there
        is none left to take), and not draining: the readiness probe."""
        return not self._stopping.is_set() and self._owner is not None and self._owner.settled

    def stop(self) -> None:
        """Stop reserving; in-flight deliveries finish, then ``run`` returns."""
        self._stopping.set()
        self.trigger.stopping()

    async def run(self) -> None:
        s = self.settings
        if not await self._start():
            await self._close_pool()
            return
        self._sender = Sender(s.allowed_networks)
        reserve = asyncio.create_task(self._reserve_loop(), name="reservation")
        recorder = asyncio.create_task(self._record_loop(), name="recorder")
        jobs: list[Job] = [
            Rebalancer(s, self.owner, self.trigger, self._reconnect),
            Maintenance(s, self.owner, self.pool, self.trigger, self.ready_list),
            ReadySweep(s, self.owner, self.pool, self.trigger, self.ready_list, self.probe.catch_up),
            Gauges(s, self.owner, self.pool, self.ready_list),
            HorizonWatch(s, self.owner, self.pool),
            CallGauges(s, self.slots, self.ready_list),
        ]
        background = [asyncio.create_task(run_every(job, self._stopping), name=job.name) for job in jobs]
        background.append(asyncio.create_task(self.probe.run(self._stopping), name="probe"))
        try:
            done, _ = await asyncio.wait(
                [reserve, recorder, *background], return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                task.result()  # a background task that died takes the worker down
            await self._drain(reserve, recorder)
        finally:
            for task in [reserve, recorder, *background, *self._sending]:
                task.cancel()
            await asyncio.gather(reserve, recorder, *background, return_exceptions=True)
            await self.owner.close()
            await self.sender.close()
            await self._close_pool()
            logger.info("worker stopped", extra={"action": "stopped"})

    async def _start(self) -> bool:
        """Open the pool and the lock connection, waiting as long as it takes
        for Postgres to be reachable and migrated: a worker that exits instead
        crash-loops through every database restart. False if stopped first."""
        s = self.settings
        delay = 0.5
        while not self._stopping.is_set():
            try:
                # No floor of idle connections: asyncpg restores a floor in
                # the background and logs a traceback for each failed try
                # while the server is down.
                self._pool = self._pool or await store.create_pool(
                    s.database_url,
                    min_size=0,
                    max_size=4,
                    server_settings=store.WORKER_SESSION,
                    reset=_keep_session,
                )
                async with store.acquire(self._pool) as conn:
                    partition_count = await store.partition_count(conn)
                # Its first snapshot before any partition is taken: what
                # commits after it, the probes find; before it, the listing
                # of each partition as it is taken.
                self._probe = self._probe or CommitProbe(s, self._pool, self._committed)
                await self.probe.start()
                self._owner = PartitionOwner(
                    s.database_url,
                    partition_count,
                    self._woken,
                    on_hint=self.probe.hinted,
                    on_snapshot=self.probe.seen,
                )
                await self.owner.connect()
                return True
            except SchemaMissing:
                logger.warning(
                    "waiting for the database schema: run `hooklane migrate`", extra={"action": "start"}
                )
            except TransientStoreError as exc:
                logger.warning("waiting for the database: %s", exc, extra={"action": "start"})
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopping.wait(), timeout=delay)
            delay = min(delay * 2, 5.0)
        return False

    async def _close_pool(self) -> None:
        if self._pool is not None:
            await self._pool.close()

    async def _drain(self, reserve: asyncio.Task, recorder: asyncio.Task) -> None:
        """Let in-flight deliveries finish, then record every result.

        A reservation round still running hands out its deliveries first:
        the drain must count them, or they are cancelled unrecorded and sent
        again after their lease. Then the partitions go, so that other
        workers serve their endpoints at once instead of after this worker's
        slowest call; the limits stay exact, as deliveries in flight are
        counted in Postgres (by their live leases) whoever owns the
        partition."""
        await reserve
        await self.owner.close()
        if self._sending:
            logger.info("draining %d deliveries in flight", len(self._sending), extra={"action": "drain"})
            await asyncio.wait(self._sending, timeout=self.settings.drain_seconds)
        self._results.put_nowait(None)
        await recorder

    def _woken(self, wakeup: Wakeup) -> None:
        """A notification for a partition this worker owns."""
        now = datetime.now(UTC)
        for endpoint_id in wakeup.endpoints:
            self.ready_list.wake(endpoint_id, wakeup.partition, wakeup.due, now)
        self.trigger.published()

    def _committed(self, committed: store.Committed) -> None:
        """What a probe found: the endpoints of this worker's partitions
        are woken. Those of a partition taken while the probe ran are kept:
        its listing may have read the queues before the events committed."""
        now = datetime.now(UTC)
        owned = self.owner.owned
        woken = False
        for endpoint_id, partition, due in committed.endpoints:
            if partition in owned:
                self.ready_list.wake(endpoint_id, partition, due, now)
                woken = True
        if woken:
            self.trigger.probed()

    async def _reserve_loop(self) -> None:
        s = self.settings
        started = 0.0
        while not self._stopping.is_set():
            self.trigger.round_starts()
            quick = min(self.slots.quick_free(), s.reserve_batch)
            long = min(self.slots.long_free(), s.reserve_batch)
            full = False
            failed = False
            if (quick > 0 or long > 0) and self.owner.owned:
                started = time.perf_counter()
                round_span: SpanContext | None = None
                answer: Answer | None = None
                slow: set[int] = set()
                try:
                    rows, slow, round_span, answer = await self._round(quick, long)
                except LostOwnership:
                    rows, failed = [], True
                    await self._reconnect()
                except TransientStoreError as exc:
                    rows, failed = [], True
                    logger.warning("reservation aborted, retrying: %s", exc, extra={"action": "reserve"})
                metrics.RESERVATION_DURATION.observe(time.perf_counter() - started)
                for row in rows:
                    assert answer is not None, "a round that reserved has answered"
                    endpoint_id, in_long = row.endpoint_id, row.endpoint_id in slow
                    call = self.slots.start(endpoint_id, row.tenant, in_long)
                    self.ready_list.started(endpoint_id, row.tenant, in_long)
                    task = asyncio.create_task(self._call(row, round_span, answer, call))
                    self._sending.add(task)
                    task.add_done_callback(self._sent)
                long_rows = sum(1 for row in rows if row.endpoint_id in slow)
                # More may be ready: go again before sleeping.
                full = (quick > 0 and len(rows) - long_rows == quick) or (long > 0 and long_rows == long)
                self._counted()
            if full:
                continue
            wake = await self.trigger.wait(self._until_due(quick > 0 or long > 0, failed))
            pause = self.trigger.pause(wake, time.perf_counter() - started, self.slots.quick_in_flight)
            if pause > 0:
                await asyncio.sleep(pause)

    def _until_due(self, free: bool, failed: bool) -> float:
        """How long to wait for the trigger: until the ready list's next
        endpoint is due, at most the poll; the whole poll when slots are
        full (a freed one fires the trigger) or the round failed."""
        poll = self.settings.poll_seconds
        due = self.ready_list.next_due()
        if due is None or not free or failed:
            return poll
        return min(poll, max(0.0, (due - datetime.now(UTC)).total_seconds()))

    async def _round(
        self, limit: int, long_limit: int
    ) -> tuple[list[store.Reserved], set[int], SpanContext | None, Answer | None]:
        """One reservation round over the endpoints whose time has come, up
        to ``limit`` deliveries for quick slots and ``long_limit`` for slow
        endpoints (one each): the deliveries reserved, the slow endpoints
        among the candidates, the round's span when traced (only a round
        that asks Postgres has one: an idle worker makes none), and when
        Postgres answered, on its clock and on this process's, which the
        deliveries' starts count from (None: not asked)."""
        await self._follow_partitions()
        candidates = self.ready_list.take(datetime.now(UTC), limit, long_limit, self.slots.share)
        if not candidates:
            return [], set(), None, None
        with tracing.internal("reserve", candidates=len(candidates)) as span:
            try:
                reservation = await self.owner.run(
                    functools.partial(
                        store.reserve,
                        candidates=[c.endpoint_id for c in candidates],
                        floors=[c.floor for c in candidates],
                        caps=[c.cap for c in candidates],
                        apart=[c.slow for c in candidates],
                        limit=limit,
                        tenant_ceiling=self.settings.tenant_max_in_flight,
                        lease_grace_seconds=self.settings.lease_grace_seconds,
                        worker_id=self.settings.worker_id,
                    )
                )
            except BaseException:
                self.ready_list.returned(candidates, datetime.now(UTC))
                raise
            if span is not None:
                span.set_attribute("hooklane.reserved", len(reservation.deliveries))
        self.ready_list.settle(
            reservation.verdicts,
            [(r.id, r.endpoint_id) for r in reservation.deliveries],
            datetime.now(UTC),
        )
        answer = None if reservation.answered_at is None else (reservation.answered_at, reservation.received)
        slow = {c.endpoint_id for c in candidates if c.slow}
        return reservation.deliveries, slow, None if span is None else span.get_span_context(), answer

    async def _follow_partitions(self) -> None:
        """Keep the ready list to the partitions owned: forget those
        released, and list the endpoints with pending deliveries of those
        taken. A partition
        listed under an earlier lock connection is listed again once a new
        one takes it: a listing that ran while the connection was replaced
        (or before) missed what was published in between, when nobody
        listened for its notifications."""
        generation, owned = self.owner.generation, set(self.owner.owned)
        listed = self._listed if self._listed_generation == generation else set()
        if owned != listed:
            self.ready_list.retain(owned)
            taken = sorted(owned - listed)
            self._listed, self._listed_generation = listed & owned, generation
            if taken:
                now = datetime.now(UTC)
                listing = await self.owner.run(lambda conn, _owned: store.pending_endpoints(conn, taken))
                for endpoint_id, partition, head in listing.endpoints:
                    self.ready_list.listed(endpoint_id, partition, head, now)
            self._listed = owned

    def _sent(self, task: asyncio.Task) -> None:
        self._sending.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("delivery task failed", exc_info=task.exception(), extra={"action": "deliver"})

    def _counted(self) -> None:
        metrics.IN_FLIGHT.set(len(self._sending))
        metrics.CALLS_IN_FLIGHT_QUICK.set(self.slots.quick_in_flight)
        metrics.CALLS_IN_FLIGHT_LONG.set(self.slots.long_in_flight)
        metrics.SLOW_ENDPOINTS_WAITING.set(self.ready_list.waiting_for_long())

    async def _call(
        self, row: store.Reserved, reserved_in: SpanContext | None, answer: Answer, call: Call
    ) -> None:
        """A delivery in its slot, which it gives back however it ends."""
        try:
            await self._deliver(row, reserved_in, answer, call)
        finally:
            self.slots.done(call)
            self._counted()
            if not call.long:
                self.trigger.slot_freed(self.slots.quick_in_flight)
            elif self.ready_list.waiting_for_long():
                self.trigger.long_slot_freed()

    def _hurried(self, call: Call, moving: list[asyncio.TimerHandle]) -> None:
        """A call still unanswered after a tenth of the threshold: it moves
        now if the quick slots are pressed, else at the threshold."""
        if not (self.slots.pressed() and self._moved(call)):
            rest = self.settings.long_call_seconds * (1 - 1 / HURRIED_SHARE)
            moving.append(asyncio.get_running_loop().call_later(rest, self._went_long, call))

    def _went_long(self, call: Call) -> None:
        """A call still unanswered at the threshold: its endpoint is slow
        from now on, and its quick slot is for the endpoints that answer,
        unless the long budget's overdraft is taken."""
        if not call.long and not call.ended and not self._moved(call):
            self.ready_list.went_long(call.endpoint_id, moved=False)

    def _moved(self, call: Call) -> bool:
        """Move the call to the long budget if it may: its endpoint is slow
        while the call runs, and from then on if it takes the threshold."""
        if not self.slots.went_long(call):
            return False
        metrics.CALLS_WENT_LONG.inc()
        self.ready_list.went_long(call.endpoint_id)
        self._counted()
        self.trigger.slot_freed(self.slots.quick_in_flight)
        return True

    async def _deliver(
        self, row: store.Reserved, reserved_in: SpanContext | None, answer: Answer, call: Call
    ) -> None:
        granted = granted_here(row.start_at, *answer)
        await _until(granted)
        if row.rate_per_second is not None:
            start = paced_start(
                granted,
                time.monotonic(),
                self._paced.get(row.endpoint_id),
                self.settings.lease_grace_seconds / 2,
            )
            if len(self._paced) > 10_000:
                self._paced.clear()
            self._paced[row.endpoint_id] = Paced(granted, start)
            await _until(start)
        late = row.ordering_key is not None and past_lease(
            granted, time.monotonic(), self.settings.lease_grace_seconds
        )
        started_at, started = datetime.now(UTC), time.perf_counter()
        long_after = self.settings.long_call_seconds
        moving: list[asyncio.TimerHandle] = []
        moving.append(
            asyncio.get_running_loop().call_later(long_after / HURRIED_SHARE, self._hurried, call, moving)
        )
        span = _attempt_span(row, reserved_in) if tracing.enabled() else None
        # Untraced, the receiver still gets the publisher's trace context,
        # unchanged: its own spans then join the producer's trace.
        traceparent = row.traceparent if span is None else tracing.traceparent_of(span.get_span_context())
        try:
            body = event_body(row.event_id, row.type, row.event_created_at, row.data)
            endpoint = owner(row.namespace, row.name)
            keys = [self._key(row.secret, endpoint)]
            if row.previous_secret is not None:
                keys.append(self._key(row.previous_secret, endpoint))
            terms = self._terms.get(row.request_terms, terms_owner(row.namespace, row.name))
            ordering = None
            if row.ordering_key is not None and row.ordering_seq is not None:
                ordering = (row.ordering_key, row.ordering_seq)
            if late:
                attempt = Attempt(None, error=LATE_ERROR, failure=FailureClass.LEASE_EXPIRED)
                outcome: Outcome = Retry(0.0, LATE_ERROR)
            else:
                attempt = await self.sender.send(
                    row.url, keys, row.event_id, body, row.timeout_seconds, traceparent, terms, ordering
                )
                outcome = self._classify(row, attempt)
        except Exception as exc:
            # Whatever went wrong before, around or after the call (a secret
            # or URL that got into Postgres malformed, a response no rule
            # foresaw), it is a failed attempt like any other: recorded,
            # backed off, dead after the limit. Left unrecorded it would be
            # rescued and sent again for ever, without backoff. Only our own
            # refusals are worded for the endpoint's owner; the rest is in
            # the log.
            logger.exception("delivery %d could not be attempted", row.id, extra={"action": "deliver"})
            if isinstance(exc, InvalidInput):
                attempt = Attempt(
                    None, error=f"invalid endpoint: {exc}", failure=FailureClass.INVALID_ENDPOINT
                )
            else:
                attempt = Attempt(None, error="internal error", failure=FailureClass.INTERNAL_ERROR)
            outcome = self._classify(row, attempt)
        moving[-1].cancel()
        duration = time.perf_counter() - started
        self.ready_list.ended(row.endpoint_id, call.long, duration >= long_after)
        timing = Timing(started_at, duration, tracing.trace_id_of(traceparent))
        result = result_of(row.id, row.attempts, attempt, outcome, timing)
        if row.ordering_key is not None:
            result = dataclasses.replace(result, ordered=(row.endpoint_id, row.ordering_key))
        metrics.DELIVERY_DURATION.observe(duration)
        metrics.ATTEMPT_DURATION_BY[result.outcome].observe(duration, tracing.exemplar(span))
        if span is not None:
            tracing.attempted(span, result)
        self._results.put_nowait(result)
        # Its slot is held until the result is written: at the endpoint's
        # limit, the next delivery waits for that.
        if self.ready_list.busy(row.endpoint_id) >= row.max_concurrency:
            self.trigger.result_awaited()
        if isinstance(outcome, Dead):
            logger.warning(
                "delivery %d to %s/%s is dead: %s",
                row.id,
                row.namespace,
                row.name,
                outcome.error,
                extra={"action": "dead", "delivery": row.id, "event": row.event_id},
            )

    def _classify(self, row: store.Reserved, attempt: Attempt) -> Outcome:
        now = datetime.now(UTC)
        age = (now - row.created_at).total_seconds()
        policy = endpoint_policy(self.settings.retry, row.max_attempts, row.max_age_seconds)
        return classify(attempt, row.attempts, age, policy, now)

    def _key(self, stored: str, endpoint: str) -> bytes:
        """The HMAC key of a secret as stored (sealed or not) for an endpoint.
        Cached by both: a sealed value opens for its own endpoint only, and a
        copy on another endpoint's row must fail as it would uncached."""
        cached = f"{endpoint} {stored}"
        key = self._keys.get(cached)
        if key is None:
            if len(self._keys) > 10_000:
                self._keys.clear()
            key = self._keys[cached] = parse_secret(unseal(self.settings.encryption_key, stored, endpoint))
        return key

    async def _record_loop(self) -> None:
        """Record results in batches: whatever queued up while the previous
        write ran goes in the next one. ``None`` in the queue means the worker
        is draining: record what is left and return. Writes start at most once
        per ``_RECORD_INTERVAL``, so that at an everyday rate the results of a
        few deliveries share a statement instead of one each; a result waits
        for that long at most, and not at all when its endpoint had all its
        slots taken by this worker: a reservation waits for that slot."""
        last = 0.0
        while True:
            batch: list[store.Result] = []
            item = await self._results.get()
            pause = last + _RECORD_INTERVAL - time.monotonic()
            await self.trigger.record_window(pause if item is not None else 0.0)
            last = time.monotonic()
            while item is not None:
                batch.append(item)
                if len(batch) >= _RECORD_BATCH or self._results.empty():
                    break
                item = self._results.get_nowait()
            if batch:
                await record(
                    self.pool,
                    batch,
                    self.settings.circuit,
                    self.trigger,
                    self.ready_list,
                    sorted(self.owner.owned),
                    self.settings.worker_id,
                    self.settings.adaptive_step_seconds,
                )
            if item is None:
                if self._results.empty():
                    return
                self._results.put_nowait(None)

    async def _reconnect(self) -> None:
        """Open a new lock connection after the old one failed; partitions are
        taken again by the next rebalance, and listed again from Postgres
        (_follow_partitions): what was notified while no connection listened
        is only there."""
        while not self._stopping.is_set():
            try:
                await self.owner.connect()
                return
            except StoreError as exc:
                logger.warning("reconnecting failed: %s", exc, extra={"action": "reconnect"})
                await asyncio.sleep(1.0)


async def _until(moment: float) -> None:
    """Sleep until ``moment`` of time.monotonic(), never less: uvloop counts
    a timer from the time it cached at the start of a pass of its loop, so a
    sleep may end a little before it is over."""
    wait = moment - time.monotonic()
    while wait > 0:
        await asyncio.sleep(wait)
        wait = moment - time.monotonic()


# The youngest generation's threshold: allocations, net of frees, between
# two collections of it (Python's default is 700).
_YOUNG_COLLECTION_EVERY = 20_000


def collect_less() -> None:
    """Fewer and smaller pauses of the cyclic garbage collector. With a
    thousand calls in flight it walked every object the worker holds in a
    full collection every few seconds, 100-150 ms each with the event loop
    stopped, and found nothing to free (the calls' objects go by reference
    counting), which held healthy calls up by as much (docs/benchmarks.md,
    section 17). What exists at start, modules and settings, is moved out
    of the collector's reach (``gc.freeze``), and the young generation is
    collected every 20,000 allocations rather than 700, so that the full
    collections, which follow from the young ones, come about 30 times less
    often. Cycles, which exceptions and their tracebacks make, are still
    collected. For the worker's own process (``hooklane worker``): it
    changes the collector of the whole interpreter."""
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(_YOUNG_COLLECTION_EVERY, middle, old)


def _long_calls_allowed(settings: Settings) -> int:
    """The long budget the open-files limit allows: each call in flight
    holds a socket, and a worker holds its quick slots' calls and up to
    ``LONG_OVERDRAFT`` times the long budget. The soft limit is raised to
    the hard one if need be; a budget beyond even that is lowered to fit,
    with a warning, rather than have calls fail as connection errors when
    the incident comes."""
    want = settings.worker_concurrency + LONG_OVERDRAFT * settings.worker_long_calls + _SPARE_FILES
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < want:
        soft = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    if soft == resource.RLIM_INFINITY or soft >= want:
        return settings.worker_long_calls
    allowed = max((soft - settings.worker_concurrency - _SPARE_FILES) // LONG_OVERDRAFT, 1)
    logger.warning(
        "HOOKLANE_WORKER_LONG_CALLS=%d needs %d open files and the limit is %d: %d long calls at most",
        settings.worker_long_calls,
        want,
        soft,
        allowed,
        extra={"action": "start"},
    )
    return allowed


def _attempt_span(row: store.Reserved, reserved_in: SpanContext | None) -> Span:
    try:
        host = urlsplit(row.url).hostname or ""
    except ValueError:
        host = ""  # a stored URL that does not parse: the attempt says so
    return tracing.attempt_span(
        parent=row.traceparent,
        endpoint=owner(row.namespace, row.name),
        tenant=row.tenant,
        attempt=row.attempts,
        host=host,
        delivery_id=row.id,
        event_id=row.event_id,
        reserved_in=reserved_in,
    )


async def record(
    pool: asyncpg.Pool,
    batch: list[store.Result],
    circuit: CircuitPolicy,
    trigger: Trigger,
    ready: ReadyList,
    owned: list[int],
    worker_id: str,
    adapt_step_seconds: float = store.ADAPT_STEP_SECONDS,
) -> None:
    """Write a batch of results and their attempts (made by ``worker_id``),
    retrying while Postgres is unreachable or aborts the statement: a
    result is never dropped while the worker lives (and if it dies, the
    lease runs out and the delivery is sent again).
    The ready list learns which slots are free and what is due again;
    retries for partitions outside ``owned`` are notified to their owner."""
    delay = 0.1
    with tracing.internal("record", results=len(batch)):
        while True:
            try:
                async with store.acquire(pool) as conn:
                    touched = await store.complete(conn, batch, circuit, owned, worker_id, adapt_step_seconds)
                break
            except TransientStoreError as exc:
                logger.warning("recording results failed, retrying: %s", exc, extra={"action": "record"})
                await asyncio.sleep(delay)
                delay = min(delay * 2, 5.0)
    for result in batch:
        metrics.DELIVERIES.labels(result.outcome).inc()
    for ep in touched:
        # As `complete` says: a batch of failures may jump past the
        # threshold, and an endpoint deactivated already is not again.
        if ep.deactivated or ep.opened:
            logger.warning(
                "endpoint %s/%s %s",
                ep.namespace,
                ep.name,
                "deactivated" if ep.deactivated else "paused: circuit open",
                extra={"action": "circuit", "endpoint": ep.id},
            )
        if ep.lowered:
            logger.info(
                "endpoint %s/%s overloaded: concurrency lowered to %d",
                ep.namespace,
                ep.name,
                ep.effective_concurrency,
                extra={"action": "adapt", "endpoint": ep.id},
            )
    now = datetime.now(UTC)
    if ready.recorded((r.delivery_id for r in batch), (ep.recorded() for ep in touched), now):
        trigger.endpoint_ready()

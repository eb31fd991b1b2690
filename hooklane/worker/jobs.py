"""The worker's background jobs, in the shape of River's maintenance services.

Each job is built with what it needs, does one pass in ``run_once`` and
returns what it did, and ``run_every`` runs it every ``period`` seconds (its
setting) while the worker lives. The hot path (reserve, send, record) is the
runner's; these keep the partitions shared, the leases and the ready list
repaired, the tables bounded and the gauges current.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Protocol, TypeVar

import asyncpg

from hooklane import metrics, store
from hooklane.errors import StoreError, TransientStoreError
from hooklane.health import EndpointHealth, exported_endpoints, standing_counts, tenant_totals
from hooklane.settings import Settings
from hooklane.worker.notifications import Notifications, Notified
from hooklane.worker.partitions import LostOwnership, PartitionOwner
from hooklane.worker.ready import ReadyList
from hooklane.worker.slots import Slots
from hooklane.worker.trigger import Trigger

logger = logging.getLogger(__name__)

# Housekeeping that needs doing by one worker only runs on the owner of
# partition 0, so that replicas do not repeat it.
_HOUSEKEEPER_PARTITION = 0

# A rescue reads the leases that ended since its last run, from this much
# before it: a margin for a reservation that committed late. Leases that
# ended earlier were rescued by that run, or by the first of a partition
# taken, which reads them all.
_RESCUE_OVERLAP = timedelta(seconds=60)
# How often the housekeeper keeps the attempt history's partitions.
PARTITIONS_EVERY = 3600.0
# Outstanding keys one statement of the ordering sweep walks: its cost, on
# the lock connection the reservations wait for, is bounded by the page
# however many keys are outstanding (docs/benchmarks.md, section 21)...
ORDERING_SWEEP_PAGE = 1000
# ...and pages a maintenance pass walks at most: 10,000 keys a pass, the
# walk going on at the next pass from where this one stopped.
ORDERING_SWEEP_PAGES = 10

# A sweep reads each queue from this much before its last run: a delivery
# the list was not told of since then is due from its transaction's
# start (the column's default), which this margin reaches back to.
_SWEEP_OVERLAP = timedelta(seconds=60)
# ...and reads, in turn, a few of the partitions from the start, each one at
# least once in this many sweeps: a row written by hand with an earlier due
# time is found by then. Read from the start, a queue walks every dead entry
# a held horizon keeps; the sweep pays a tenth of that per run, not all of it.
SWEEP_WHOLE_EVERY = 10
# The endpoints a sweep's warning names, at most: enough to look one up.
_LOST_NAMED = 20


class Job(Protocol):
    @property
    def name(self) -> str: ...

    @property
    def period(self) -> float: ...

    async def run_once(self) -> object: ...


async def run_every(job: Job, stopping: asyncio.Event) -> None:
    """Run ``job`` every ``job.period`` seconds until ``stopping`` is set.
    Losing Postgres for a while is survivable and retried next period; any
    other error is a bug and stops the worker."""
    while not stopping.is_set():
        try:
            await job.run_once()
        except TransientStoreError as exc:
            logger.warning("%s failed, retrying: %s", job.name, exc, extra={"action": "retry"})
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stopping.wait(), timeout=job.period)


@dataclass(frozen=True)
class Rebalanced:
    taken: frozenset[int] = frozenset()
    released: frozenset[int] = frozenset()
    # The lock connection had failed: a new one is open, and the partitions
    # are taken again on the next pass.
    reconnected: bool = False


class Rebalancer:
    """Keeps this worker's fair share of the partitions."""

    name = "rebalancer"

    def __init__(
        self,
        settings: Settings,
        owner: PartitionOwner,
        trigger: Trigger,
        reconnect: Callable[[], Awaitable[None]],
    ) -> None:
        self.period = settings.rebalance_seconds
        self._owner = owner
        self._trigger = trigger
        self._reconnect = reconnect

    async def run_once(self) -> Rebalanced:
        try:
            taken, released = await self._owner.rebalance()
        except LostOwnership:
            await self._reconnect()
            return Rebalanced(reconnected=True)
        metrics.PARTITIONS_OWNED.set(len(self._owner.owned))
        if taken:
            self._trigger.partitions_taken()
        return Rebalanced(frozenset(taken), frozenset(released))


@dataclass(frozen=True)
class Maintained:
    rescued: int = 0
    # The rest is done by the owner of partition 0 only (``housekeeper``).
    housekeeper: bool = False
    deactivated: tuple[str, ...] = ()  # namespace/name
    purged: int = 0
    analysed: bool = False
    # None when the attempt partitions were not due for a pass.
    partitions: store.PartitionsKept | None = None
    # None when no notifications tenant is set.
    notified: Notified | None = None


class Maintenance:
    """Rescues expired leases in the partitions this worker owns; on the
    owner of partition 0, also deactivates endpoints failing for too long,
    purges events past retention, refreshes the endpoints' statistics and
    publishes the operational notifications (worker/notifications.py)."""

    name = "maintenance"

    def __init__(
        self,
        settings: Settings,
        owner: PartitionOwner,
        pool: asyncpg.Pool,
        trigger: Trigger,
        ready: ReadyList,
    ) -> None:
        self.period = settings.maintenance_seconds
        self._settings = settings
        self._owner = owner
        self._pool = pool
        self._trigger = trigger
        self._ready = ready
        # The partitions the last rescue read, and from when the next reads.
        self._rescued_in: set[int] = set()
        self._since: datetime | None = None
        # The key the ordering sweep's next page starts after (None: the
        # first): the walk goes on across passes.
        self._swept_after: tuple[int, str] | None = None
        # When the attempt partitions were last kept (monotonic; None: never).
        self._kept_at: float | None = None
        self._notifications = Notifications(settings)

    async def _rescue(self) -> int:
        owned = set(self._owner.owned)
        since = self._since if owned <= self._rescued_in else None
        try:
            rescued = await self._owner.run(lambda conn, held: store.rescue_expired(conn, held, since))
        except LostOwnership:
            self._rescued_in = set()
            raise
        self._rescued_in, self._since = owned, rescued.checked_at - _RESCUE_OVERLAP
        now = datetime.now(UTC)
        for endpoint_id, partition, due in rescued.endpoints:
            self._ready.wake(endpoint_id, partition, due, now)
        return len(rescued.endpoints)

    async def _sweep_ordering(self) -> int:
        """Keys whose head settled without the key moving on: one a
        publishing transaction held when its head was recorded (the worker
        does not wait for an application's commit), one a worker died
        between, one whose endpoint's policy became 'skip'. A page a
        statement from where the last pass stopped, the lock connection
        free for the reservations between pages."""
        promoted = 0
        now = datetime.now(UTC)
        for _ in range(ORDERING_SWEEP_PAGES):
            swept = await self._owner.run(
                partial(store.sweep_ordering, after=self._swept_after, page=ORDERING_SWEEP_PAGE)
            )
            self._swept_after = swept.after
            for endpoint_id, partition, _key, due in swept.woken:
                self._ready.wake(endpoint_id, partition, due, now)
            promoted += len(swept.woken)
            if swept.after is None:
                break
        return promoted

    async def run_once(self) -> Maintained:
        try:
            rescued = await self._rescue()
            promoted = await self._sweep_ordering()
        except LostOwnership:
            return Maintained()
        if promoted:
            logger.info("%d ordering keys moved on by the sweep", promoted, extra={"action": "ordering"})
            self._trigger.work_found()
        if rescued:
            metrics.RESCUED.inc(rescued)
            logger.warning(
                "requeued %d deliveries whose worker lost them", rescued, extra={"action": "rescue"}
            )
            self._trigger.work_found()
        if _HOUSEKEEPER_PARTITION not in self._owner.owned:
            return Maintained(rescued)
        s = self._settings
        async with store.acquire(self._pool) as conn:
            deactivated = await store.deactivate_failing(conn, s.deactivate_after_seconds)
            for ep in deactivated:
                logger.warning(
                    "endpoint %s/%s deactivated after failing for %d s; its pending deliveries are kept",
                    ep["namespace"],
                    ep["name"],
                    s.deactivate_after_seconds,
                    extra={"action": "deactivate", "endpoint": ep["id"]},
                )
            purged = await store.purge_events(conn, s.event_retention_seconds)
            await store.purge_catalogue_refusals(conn, s.event_retention_seconds)
            await store.purge_ordering_keys(conn, s.event_retention_seconds)
            partitions = await self._keep_partitions(conn)
            # Publish's fan-out is written not to depend on these
            # statistics, but every other statement reading endpoints is
            # planned from them, and autovacuum may take minutes to notice
            # 10,000 endpoints applied at once (or never, if it is off).
            analysed = await store.refresh_endpoint_statistics(conn)
            if analysed:
                logger.info("endpoints analysed after many changed", extra={"action": "analyze"})
            # Last: the deactivations above are told in this pass, and a
            # failure here leaves the rest done.
            notified = await self._notifications.run_once(conn)
        return Maintained(
            rescued,
            housekeeper=True,
            deactivated=tuple(f"{ep['namespace']}/{ep['name']}" for ep in deactivated),
            purged=purged,
            analysed=analysed,
            partitions=partitions,
            notified=notified,
        )

    async def _keep_partitions(self, conn: asyncpg.Connection) -> store.PartitionsKept | None:
        """Make the attempt history's partitions ahead and drop those past
        retention, once per ``PARTITIONS_EVERY``: a day's partition is made
        days before it starts, so an hour late costs nothing."""
        now = time.monotonic()
        if self._kept_at is not None and now - self._kept_at < PARTITIONS_EVERY:
            return None
        kept = await store.keep_attempt_partitions(conn, self._settings.attempt_retention_seconds)
        self._kept_at = now
        if kept.created or kept.dropped or kept.purged:
            logger.info(
                "attempt history: created %s, dropped %s, %d rows deleted from the default partition",
                ", ".join(kept.created) or "no partition",
                ", ".join(kept.dropped) or "none",
                kept.purged,
                extra={"action": "partitions"},
            )
        if kept.busy:
            logger.warning(
                "attempt history: %s past retention but in use, dropped on a later pass",
                ", ".join(kept.busy),
                extra={"action": "partitions"},
            )
        return kept


class ReadySweep:
    """Reads again the queue of every endpoint of this worker's partitions
    with pending deliveries (a safety net for a delivery the list was never
    told of: written by hand, or notified while no worker listened); returns
    how many with pending deliveries the ready list did not have scheduled. Should find
    none in steady state (docs/state-machine.md). Each queue is read from a
    little before the last sweep, and a tenth of the partitions (in turn)
    from the start: a held horizon keeps a dead entry for every delivery
    sent, which a read from the start walks."""

    name = "sweep"

    def __init__(
        self,
        settings: Settings,
        owner: PartitionOwner,
        pool: asyncpg.Pool,
        trigger: Trigger,
        ready: ReadyList,
        caught_up: Callable[[], Awaitable[None]] | None = None,
    ) -> None:
        self.period = settings.sweep_seconds
        # The worker's probe (CommitProbe.catch_up), run after the listing.
        self._caught_up = caught_up
        self._owner = owner
        self._pool = pool
        self._trigger = trigger
        self._ready = ready
        # The partitions the last sweep read, from when the next reads them,
        # and whose turn it is to be read from the start.
        self._swept_in: set[int] = set()
        self._since: datetime | None = None
        self._turn = 0

    def _whole(self, owned: list[int]) -> list[int]:
        """The partitions this sweep reads from the start."""
        whole = owned[self._turn % SWEEP_WHOLE_EVERY :: SWEEP_WHOLE_EVERY]
        self._turn += 1
        return whole

    async def run_once(self) -> int:
        owned = sorted(self._owner.owned)
        # Partitions taken since the last sweep (all of them at the first)
        # are read from the start.
        whole = sorted(set(self._whole(owned)) | (set(owned) - self._swept_in))
        # On the pool, not the lock connection, where the reservation would
        # wait for it. It only reads; what it lists of a partition lost
        # meanwhile is left out.
        mark = self._ready.mark()
        async with store.acquire(self._pool) as conn:
            listing = await store.pending_endpoints(conn, owned, self._since, whole)
        # Published events reach the list by the probe, up to a second after
        # they commit: one probe now tells the list of every event the
        # listing read, so what it lists unscheduled was lost, not merely not
        # probed for yet. A probe before the listing would leave the events
        # committed between the two looking lost.
        if self._caught_up is not None:
            await self._caught_up()
        self._swept_in, self._since = set(owned), listing.checked_at - _SWEEP_OVERLAP
        pending = [p for p in listing.endpoints if p[1] in self._owner.owned]
        # Rounds go on while the listing is read: an endpoint whose last
        # delivery one reserved meanwhile is rightly unscheduled, and counts
        # as lost only if nothing has handled it since before the read.
        lost = [endpoint_id for endpoint_id, _, _ in pending if self._ready.lost(endpoint_id, mark)]
        now = datetime.now(UTC)
        for endpoint_id, partition, head in pending:
            self._ready.listed(endpoint_id, partition, head, now, from_start=partition in whole)
        if lost:
            logger.warning(
                "%d endpoints had pending deliveries but were not ready; made ready",
                len(lost),
                extra={"action": "sweep", "endpoints": sorted(lost)[:_LOST_NAMED]},
            )
            self._trigger.work_found()
        return len(lost)


@dataclass(frozen=True)
class Exported:
    exported: int  # endpoints with per-endpoint gauges
    owned: int  # endpoints of the partitions this worker owns


# How many gauge periods the listings may show a pass's counts: past that
# (the worker gone, or stalled), they count the queues themselves.
_SUMMARY_PERIODS = 3


class CallGauges:
    """Sets the gauges of this worker's calls in flight: its capacity by
    slot class, and its busiest tenants' calls (a few, so that the series
    stay bounded whatever the number of tenants). No I/O."""

    name = "call-gauges"

    def __init__(self, settings: Settings, slots: Slots, ready: ReadyList) -> None:
        self.period = settings.gauges_seconds
        self._slots = slots
        self._ready = ready
        self._shown: set[str] = set()

    async def run_once(self) -> None:
        metrics.CALL_CAPACITY.labels("quick").set(self._slots.quick)
        metrics.CALL_CAPACITY.labels("long").set(self._slots.long)
        metrics.SLOW_ENDPOINTS_WAITING.set(self._ready.waiting_for_long())
        top = dict(self._slots.top_tenants(metrics.TOP_TENANTS))
        for tenant in self._shown - top.keys():
            metrics.TENANT_CALLS_IN_FLIGHT.remove(tenant)
        for tenant, calls in top.items():
            metrics.TENANT_CALLS_IN_FLIGHT.labels(tenant).set(calls)
        self._shown = set(top)


# Endpoints a gauge pass reads at a time. The records of one slice are
# built in one go, with the event loop held: a worker's 1,800 endpoints read
# at once held it 15-30 ms each period on an idle machine, and where slow
# receivers loaded the worker, the healthy calls due at those moments
# waited up to 0.7 s (docs/benchmarks.md, section 17).
GAUGE_SLICE_ENDPOINTS = 256


def gauge_slices(partitions: list[int], per_partition: float) -> list[list[int]]:
    """``partitions`` in slices of about ``GAUGE_SLICE_ENDPOINTS``
    endpoints, at ``per_partition`` endpoints each (0: not known yet, one
    partition a slice)."""
    size = max(1, int(GAUGE_SLICE_ENDPOINTS // per_partition)) if per_partition > 0 else 1
    return [partitions[i : i + size] for i in range(0, len(partitions), size)]


class Gauges:
    """Sets the per-endpoint and per-tenant gauges of the endpoints of this
    worker's partitions, as many as ``HOOKLANE_METRICS_ENDPOINTS`` says, and
    keeps their queue counts for the endpoint listings."""

    name = "gauges"

    def __init__(
        self, settings: Settings, owner: PartitionOwner, pool: asyncpg.Pool, ready: ReadyList
    ) -> None:
        self.period = settings.gauges_seconds
        self._settings = settings
        self._owner = owner
        self._pool = pool
        self._ready = ready
        # Endpoints per partition at the last pass: how many partitions a
        # slice may take.
        self._per_partition = 0.0

    async def run_once(self) -> Exported:
        owned = sorted(self._owner.owned)
        healths: list[EndpointHealth] = []
        for part in gauge_slices(owned, self._per_partition):
            async with store.acquire(self._pool) as conn:
                # Pending deliveries counted from the ready list's floors, and
                # not at all for an endpoint it does not hold: not past every
                # dead entry a held horizon keeps (issues 21 and 37).
                counted = await store.endpoint_health(
                    conn, part, floors=self._ready.floors(part), listed=True
                )
                # The listings show these counts while they are fresh, rather
                # than walk every queue from its start themselves.
                await store.write_queue_summaries(conn, part, counted, _SUMMARY_PERIODS * self.period)
            healths.extend(counted)
        if owned:
            self._per_partition = len(healths) / len(owned)
        unrouted = None
        if _HOUSEKEEPER_PARTITION in owned:
            async with store.acquire(self._pool) as conn:
                unrouted = await store.unrouted_events(conn)
        s = self._settings
        exported = exported_endpoints(healths, s.metrics_endpoints, s.metrics_endpoints_top)
        for gauge in (*metrics.PER_ENDPOINT, *metrics.PER_TENANT):
            gauge.clear()
        metrics.ENDPOINTS_EXPORTED.labels("exported").set(len(exported))
        metrics.ENDPOINTS_EXPORTED.labels("owned").set(len(healths))
        for h in exported:
            labels = (h.namespace, h.name)
            metrics.ENDPOINT_PENDING.labels(*labels).set(h.pending)
            metrics.ENDPOINT_IN_FLIGHT.labels(*labels).set(h.in_flight)
            metrics.ENDPOINT_OLDEST_PENDING_AGE.labels(*labels).set(h.oldest_pending_age or 0.0)
            if h.dead:
                metrics.ENDPOINT_DEAD.labels(*labels).set(h.dead)
        # Whatever HOOKLANE_METRICS_ENDPOINTS says: only endpoints that asked
        # for adaptive concurrency, and only while it holds them back.
        for h in healths:
            if h.adaptive_concurrency and h.effective_concurrency < h.max_concurrency:
                metrics.ENDPOINT_EFFECTIVE_CONCURRENCY.labels(h.namespace, h.name).set(
                    h.effective_concurrency
                )
        if s.metrics_endpoints == "tenant":
            for tenant, sums in tenant_totals(healths).items():
                metrics.TENANT_PENDING.labels(tenant).set(sums.pending)
                metrics.TENANT_IN_FLIGHT.labels(tenant).set(sums.in_flight)
                metrics.TENANT_OLDEST_PENDING_AGE.labels(tenant).set(sums.oldest_pending_age)
                metrics.TENANT_DEAD.labels(tenant).set(sums.dead)
        paused, probing = standing_counts(healths)
        for reason, count in paused.items():
            metrics.ENDPOINTS_PAUSED.labels(reason).set(count)
        metrics.ENDPOINTS_PROBING.set(probing)
        # Only the owner of partition 0 counts; the others show 0, not the
        # count from when they last owned it, which would hide a later rise.
        metrics.EVENTS_UNROUTED.set(unrouted or 0)
        return Exported(exported=len(exported), owned=len(healths))


# Postgres' SQLSTATE for a statement this role may not run.
_INSUFFICIENT_PRIVILEGE = "42501"
_T = TypeVar("_T")


@dataclass(frozen=True)
class Sighting:
    """A holder of the xmin horizon as one pass saw it, to tell the next
    pass whether the horizon stayed put."""

    key: tuple[object, ...]
    since: float  # time.monotonic() when first seen


def held_for(
    holder: store.HorizonHolder, previous: Sighting | None, now: float
) -> tuple[Sighting, float | None]:
    """The sighting of ``holder`` at ``now``, and how long it has held the
    horizon: None when seen first, since a short transaction, or a long one
    whose snapshot moves with every statement (READ COMMITTED), shows
    another xmin at the next pass. Seen again, it is the age of its
    transaction where Postgres keeps it, or else (a slot, a standby,
    another role's session without pg_read_all_stats) how long it has been
    seen."""
    key = (holder.kind, holder.pid, holder.name, holder.xmin)
    if previous is None or previous.key != key:
        return Sighting(key, now), None
    return previous, max(holder.seconds or 0.0, now - previous.since)


@dataclass(frozen=True)
class HorizonSeen:
    """What HorizonWatch saw; all empty on a worker without partition 0."""

    housekeeper: bool = False
    visible: bool = False
    holder: store.HorizonHolder | None = None
    # How long the holder has held the horizon, as exported: 0 until a pass
    # sees it again at the same xmin; then it is named (HORIZON_HOLDER).
    seconds: float = 0.0
    named: bool = False
    tables: tuple[store.TableStatistics, ...] = ()
    refused: tuple[str, ...] = ()  # the statements this role may not run, and why


class HorizonWatch:
    """On the owner of partition 0, reports what holds back the database's
    xmin horizon (a long transaction or snapshot of any session, Hooklane's
    own included, a prepared transaction, a replication slot, a standby's
    feedback) and the live and dead rows and vacuums of Hooklane's tables:
    while the horizon is held, every row the queue deletes or updates stays
    behind as a dead row (docs/shared-database.md). A view this role may
    not read is reported, in the log and by what it leaves out, and the
    worker goes on."""

    name = "horizon"

    def __init__(self, settings: Settings, owner: PartitionOwner, pool: asyncpg.Pool) -> None:
        self.period = settings.gauges_seconds
        self._owner = owner
        self._pool = pool
        self._sighting: Sighting | None = None
        self._warned: tuple[bool, tuple[str, ...]] = (True, ())  # visible, refused

    async def run_once(self) -> HorizonSeen:
        if _HOUSEKEEPER_PARTITION not in self._owner.owned:
            self._sighting = None
            seen = HorizonSeen()
            _export_horizon(seen)
            return seen
        refused: list[str] = []
        async with store.acquire(self._pool) as conn:
            horizon = await _unless_refused(refused, "xmin_horizon", store.xmin_horizon(conn))
            tables = await _unless_refused(refused, "table_statistics", store.table_statistics(conn))
        holder = horizon.holder if horizon else None
        seconds = None
        if holder is None:
            self._sighting = None
        else:
            self._sighting, seconds = held_for(holder, self._sighting, time.monotonic())
        seen = HorizonSeen(
            housekeeper=True,
            visible=horizon.visible if horizon else False,
            holder=holder,
            seconds=seconds or 0.0,
            named=seconds is not None,
            tables=tuple(tables or ()),
            refused=tuple(refused),
        )
        self._warn(seen)
        _export_horizon(seen)
        return seen

    def _warn(self, seen: HorizonSeen) -> None:
        """Say once, not every pass, what this role cannot see."""
        if (seen.visible, seen.refused) == self._warned:
            return
        self._warned = (seen.visible, seen.refused)
        for why in seen.refused:
            logger.warning("%s; not reported", why, extra={"action": "horizon"})
        if not seen.visible and not seen.refused:
            logger.warning(
                "the database role cannot see other roles' transactions (grant it pg_read_all_stats): "
                "the xmin horizon's holder is named, its age counts from when this worker first saw it",
                extra={"action": "horizon"},
            )


async def _unless_refused(refused: list[str], statement: str, call: Awaitable[_T]) -> _T | None:
    """``call``'s answer; None, and why in ``refused``, if Postgres refused
    this role the views it reads. Any other error is raised."""
    try:
        return await call
    except StoreError as exc:
        if exc.sqlstate != _INSUFFICIENT_PRIVILEGE:
            raise
        refused.append(f"{statement} refused: {exc}")
        return None


def _export_horizon(seen: HorizonSeen) -> None:
    # Cleared and set with no await between: a scrape sees one pass's series.
    metrics.HORIZON_HOLDER.clear()
    for gauge in metrics.PER_TABLE:
        gauge.clear()
    holder = seen.holder
    metrics.HORIZON_AGE.set(seen.seconds)
    metrics.HORIZON_XID_AGE.set(holder.xid_age if holder else 0)
    metrics.HORIZON_VISIBLE.set(1 if seen.visible else 0)
    if holder is not None and seen.named:
        metrics.HORIZON_HOLDER.labels(
            holder.kind,
            "" if holder.pid is None else str(holder.pid),
            holder.usename or "",
            holder.application_name or "",
            holder.state or "",
            holder.name or "",
        ).set(1)
    for t in seen.tables:
        metrics.TABLE_LIVE_ROWS.labels(t.table).set(t.live)
        metrics.TABLE_DEAD_ROWS.labels(t.table).set(t.dead)
        metrics.TABLE_AUTOVACUUMS.labels(t.table).set(t.autovacuums)
        if t.last_autovacuum is not None:
            metrics.TABLE_LAST_AUTOVACUUM.labels(t.table).set(t.last_autovacuum.timestamp())
        if t.last_vacuum is not None:
            metrics.TABLE_LAST_VACUUM.labels(t.table).set(t.last_vacuum.timestamp())

"""The worker's background jobs, one pass each (``run_once``) on a real
Postgres: what each did, as it says and as the database shows, whom it
woke, and the loop that runs them (hooklane/worker/jobs.py)."""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import asyncpg
import pytest
from prometheus_client import REGISTRY

import hooklane
from hooklane import metrics, store
from hooklane.settings import Settings
from hooklane.worker import jobs, ordering
from hooklane.worker.commits import CommitProbe
from hooklane.worker.jobs import (
    SWEEP_WHOLE_EVERY,
    Exported,
    Gauges,
    HorizonSeen,
    HorizonWatch,
    Maintained,
    Maintenance,
    ReadySweep,
    Rebalanced,
    Rebalancer,
)
from hooklane.worker.partitions import PartitionOwner
from hooklane.worker.ready import ReadyList
from hooklane.worker.runner import Worker
from hooklane.worker.trigger import Trigger, Wake
from testsupport.fixtures import add_endpoint, queue_unannounced, reserve_round, wait_for
from testsupport.worker_jobs import said

ALL = list(range(32))


@pytest.fixture
async def idle_owner(dsn: str, db: asyncpg.Connection) -> AsyncIterator[PartitionOwner]:
    """A worker's lock connection, holding no partition yet."""
    owner = PartitionOwner(dsn, await store.partition_count(db), lambda _p: None)
    await owner.connect()
    yield owner
    await owner.close()


@pytest.fixture
async def owner(idle_owner: PartitionOwner) -> PartitionOwner:
    """The only worker's lock connection: it owns every partition, 0 too."""
    await idle_owner.rebalance()
    assert idle_owner.owned == set(ALL)
    return idle_owner


@pytest.fixture
async def pool(dsn: str) -> AsyncIterator[asyncpg.Pool]:
    p = await store.create_pool(dsn, min_size=0, max_size=2)
    yield p
    await p.close()


@pytest.fixture
def trigger(settings: Settings) -> Trigger:
    return Trigger(settings.worker_concurrency)


def _sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


# --- the loop ---------------------------------------------------------------


# --- rebalancer -------------------------------------------------------------


async def test_the_rebalancer_takes_the_partitions_and_wakes_the_reservation(settings, idle_owner, trigger):
    reconnects = []

    async def reconnect() -> None:
        reconnects.append(True)
        await idle_owner.connect()

    rebalancer = Rebalancer(settings, idle_owner, trigger, reconnect)
    assert rebalancer.period == settings.rebalance_seconds
    assert await rebalancer.run_once() == Rebalanced(taken=frozenset(ALL))
    assert _sample("hooklane_worker_partitions_owned") == 32
    assert await trigger.wait(0) is Wake.FIRED
    trigger.round_starts()
    assert await rebalancer.run_once() == Rebalanced()  # its share already
    assert await trigger.wait(0) is Wake.POLL
    assert not reconnects


async def test_the_rebalancer_reconnects_a_lost_lock_connection(db, settings, owner, trigger):
    reconnects = []

    async def reconnect() -> None:
        reconnects.append(True)
        await owner.connect()

    rebalancer = Rebalancer(settings, owner, trigger, reconnect)
    await db.execute(
        "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name LIKE 'hooklane-worker:%'"
    )
    assert await rebalancer.run_once() == Rebalanced(reconnected=True)
    assert reconnects == [True] and owner.owned == set()
    assert await rebalancer.run_once() == Rebalanced(taken=frozenset(ALL))


async def test_partitions_taken_again_on_a_new_lock_connection_are_listed_again(db, settings, owner):
    worker = Worker(settings)
    worker._owner = owner
    await worker._follow_partitions()  # listed under this connection: nothing pending
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    # The lock connection is replaced: what is published before the new one
    # takes the partitions back is notified to nobody. (A listing that ran
    # while a reconnect was under way left the same partitions marked as
    # listed: chaos runs with terminated backends waited for the sweep.)
    await owner.close()
    await owner.connect()
    await hooklane.publish(db, tenant="acme", type="t", data={})
    await owner.rebalance()
    assert owner.owned == set(ALL)
    await worker._follow_partitions()
    assert worker.ready_list.scheduled(endpoint)


# --- maintenance ------------------------------------------------------------


async def test_maintenance_requeues_expired_leases_and_wakes_the_reservation(
    db, settings, owner, pool, trigger, caplog
):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a", max_concurrency=5)
    for _ in range(4):
        await hooklane.publish(db, tenant="acme", type="t", data={})
    assert len(await reserve_round(db, 10, worker="lost")) == 4
    await db.execute(
        "UPDATE deliveries SET lease_expires_at = now() - interval '1 second' WHERE id IN "
        "(SELECT id FROM deliveries ORDER BY id LIMIT 3)"
    )
    ready = ReadyList()
    maintenance = Maintenance(settings, owner, pool, trigger, ready)
    assert maintenance.period == settings.maintenance_seconds
    before = _sample("hooklane_deliveries_rescued_total")
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        done = await maintenance.run_once()
    assert (done.rescued, done.housekeeper) == (3, True)
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'pending'") == 3
    assert _sample("hooklane_deliveries_rescued_total") == before + 3
    assert said(caplog) == [("requeued 3 deliveries whose worker lost them", "rescue")]
    assert await trigger.wait(0) is Wake.FIRED
    # the ready list has their endpoint due, its queue to be read from the
    # start (this list never read it)
    endpoint = await db.fetchval("SELECT id FROM endpoints")
    assert ready.floor(endpoint) is None  # never read: from the start
    assert ready.scheduled(endpoint)

    trigger.round_starts()
    assert (await maintenance.run_once()).rescued == 0  # the fourth lease is live
    assert await trigger.wait(0) is Wake.POLL


async def test_maintenance_walks_the_ordering_keys_a_few_pages_a_pass(
    db, settings, owner, pool, trigger, monkeypatch
):
    monkeypatch.setattr(jobs, "ORDERING_SWEEP_PAGE", 1)
    monkeypatch.setattr(jobs, "ORDERING_SWEEP_PAGES", 2)
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for key in ("k0", "k1", "k2") * 2:
        await hooklane.publish(db, tenant="acme", type="t", data={}, ordering_key=key)
    # The heads recorded without their keys moving on, as by a worker that
    # died between the two.
    await db.execute("UPDATE deliveries SET state = 'delivered' WHERE ordering_seq = 1")
    due = (
        "SELECT array_agg(ordering_key ORDER BY ordering_key) FROM deliveries"
        " WHERE state = 'pending' AND next_attempt_at < 'infinity'"
    )
    ready = ReadyList()
    maintenance = Maintenance(settings, owner, pool, trigger, ready)

    await maintenance.run_once()
    assert await db.fetchval(due) == ["k0", "k1"]
    assert ready.scheduled(endpoint)
    assert await trigger.wait(0) is Wake.FIRED
    # The next pass goes on after k1.
    await maintenance.run_once()
    assert await db.fetchval(due) == ["k0", "k1", "k2"]


async def test_the_owner_of_partition_0_deactivates_and_purges(db, settings, owner, pool, trigger, caplog):
    await add_endpoint(db, "old", "http://127.0.0.1:1/old")
    await add_endpoint(db, "new", "http://127.0.0.1:1/new")
    await db.execute(
        "UPDATE endpoints SET failing_since = now() - interval '5 days 1 minute' WHERE name = 'old'"
    )
    await db.execute("UPDATE endpoints SET failing_since = now() - interval '4 days' WHERE name = 'new'")
    unrouted = [await hooklane.publish(db, tenant="nobody", type="t", data={}) for _ in range(2)]
    await db.execute("UPDATE events SET created_at = now() - interval '31 days' WHERE id = ANY($1)", unrouted)
    maintenance = Maintenance(settings, owner, pool, trigger, ReadyList())
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        done = await maintenance.run_once()
    assert (done.housekeeper, done.deactivated, done.purged) == (True, ("default/old",), 2)
    assert said(caplog) == [
        (
            "endpoint default/old deactivated after failing for 432000 s; its pending deliveries are kept",
            "deactivate",
        )
    ]
    assert await db.fetchval("SELECT state FROM endpoints WHERE name = 'old'") == "deactivated"
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    again = await maintenance.run_once()
    assert (again.deactivated, again.purged) == ((), 0)
    # The attempt partitions: kept on the first pass (the migration made
    # them all already), then not again within the hour.
    assert done.partitions == store.PartitionsKept() and again.partitions is None


async def test_the_owner_of_partition_0_analyses_endpoints_after_many_changed(
    db, settings, owner, pool, trigger
):
    await db.execute("ALTER TABLE endpoints SET (autovacuum_enabled = off)")
    for i in range(60):
        await add_endpoint(db, f"ep-{i:02d}", "http://127.0.0.1:1/x")
    # rather than the 10 s an idle session waits to report them
    await db.execute("SELECT pg_stat_force_next_flush()")
    maintenance = Maintenance(settings, owner, pool, trigger, ReadyList())

    async def analysed() -> bool:
        # the statistics system sees the inserts a moment after they commit
        return (await maintenance.run_once()).analysed

    await wait_for(analysed, timeout=30)
    assert await db.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'endpoints'::regclass") == 60
    assert (await maintenance.run_once()).analysed is False


async def test_a_worker_without_partition_0_keeps_no_house(db, settings, idle_owner, pool, trigger):
    await add_endpoint(db, "old", "http://127.0.0.1:1/old")
    await db.execute("UPDATE endpoints SET failing_since = now() - interval '6 days'")
    maintenance = Maintenance(settings, idle_owner, pool, trigger, ReadyList())
    assert await maintenance.run_once() == Maintained()
    assert await db.fetchval("SELECT state FROM endpoints") == "active"


# --- the ready sweep --------------------------------------------------------


async def test_the_sweep_says_how_many_endpoints_it_made_ready(db, settings, owner, pool, trigger, caplog):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "paused", "http://127.0.0.1:1/p", paused=True)
    await queue_unannounced(db)
    ready = ReadyList()
    sweep = ReadySweep(settings, owner, pool, trigger, ready)
    assert sweep.period == settings.sweep_seconds
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        assert await sweep.run_once() == 1  # not the paused one
    assert said(caplog) == [("1 endpoints had pending deliveries but were not ready; made ready", "sweep")]
    assert [r.endpoints for r in caplog.records] == [[endpoint]]
    assert await trigger.wait(0) is Wake.FIRED
    assert [c.endpoint_id for c in ready.take(datetime.now(UTC), 10)] == [endpoint]
    # read from its head, which the sweep found from the start
    assert ready.floor(endpoint) == await db.fetchval("SELECT min(next_attempt_at) FROM deliveries")

    trigger.round_starts()
    assert await sweep.run_once() == 0  # in a round now: scheduled
    assert await trigger.wait(0) is Wake.POLL


async def test_the_previous_versions_sweep_finds_a_publish_that_notified_nobody(
    db, settings, owner, pool, trigger
):
    # From migration 0019 on a worker of the previous version hears of no
    # publish: its sweep, which has no probe to run first, finds it.
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    ready = ReadyList()
    assert await ReadySweep(settings, owner, pool, trigger, ready).run_once() == 1
    assert [c.endpoint_id for c in ready.take(datetime.now(UTC), 10)] == [endpoint]


@pytest.mark.parametrize("published", ["before the probe", "after the probe"])
async def test_the_sweep_counts_no_publish_around_its_probe_as_lost(
    db, settings, owner, pool, trigger, published
):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    ready = ReadyList()

    def found(committed: store.Committed) -> None:
        for endpoint_id, partition, due in committed.endpoints:
            ready.wake(endpoint_id, partition, due, datetime.now(UTC))

    probe = CommitProbe(settings, pool, found)
    await probe.start()

    # An application commits just before or just after the sweep's probe.
    async def caught_up() -> None:
        if published == "before the probe":
            await hooklane.publish(db, tenant="acme", type="order.created", data={})
        await probe.catch_up()
        if published == "after the probe":
            await hooklane.publish(db, tenant="acme", type="order.created", data={})

    sweep = ReadySweep(settings, owner, pool, trigger, ready, caught_up)
    assert await sweep.run_once() == 0
    await probe.catch_up()
    assert ready.scheduled(endpoint)


async def _sweeps_until_found(sweep: ReadySweep, most: int) -> int:
    """How many sweeps ran until one found an endpoint not scheduled."""
    for n in range(1, most + 1):
        if await sweep.run_once():
            return n
    return 0


async def test_a_sweep_reads_each_queue_from_its_last_run_and_a_tenth_of_them_from_the_start(
    db, settings, owner, pool, trigger
):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    partition = await db.fetchval("SELECT partition FROM endpoints WHERE id = $1", endpoint)
    ready = ReadyList()
    sweep = ReadySweep(settings, owner, pool, trigger, ready)
    assert await sweep.run_once() == 0  # nothing pending; every queue read from the start
    # Written by hand since, due from its transaction's start: the next
    # sweep finds it, though it reads most queues from its last run on.
    await queue_unannounced(db)
    assert await _sweeps_until_found(sweep, 1) == 1
    head = await db.fetchval("SELECT next_attempt_at FROM deliveries")
    assert ready.scheduled(endpoint)
    floor = ready.floor(endpoint)
    assert floor is None or floor <= head

    # Written by hand an hour back, and forgotten by the list: found once
    # its partition's turn to be read from the start comes, within
    # SWEEP_WHOLE_EVERY sweeps, and not before. Two sweeps took the turns
    # 0 and 1.
    await db.execute("UPDATE deliveries SET next_attempt_at = now() - interval '1 hour'")
    ready.retain(set())
    ready.retain(set(ALL))
    wait = (partition - 2) % SWEEP_WHOLE_EVERY + 1
    assert await _sweeps_until_found(sweep, SWEEP_WHOLE_EVERY) == wait
    assert ready.floor(endpoint) == await db.fetchval("SELECT next_attempt_at FROM deliveries")


async def test_a_sweep_of_partitions_just_taken_reads_them_from_the_start(
    db, settings, idle_owner, pool, trigger
):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    ready = ReadyList()
    sweep = ReadySweep(settings, idle_owner, pool, trigger, ready)
    assert await sweep.run_once() == 0  # owns nothing yet
    await queue_unannounced(db)
    await db.execute("UPDATE deliveries SET next_attempt_at = now() - interval '1 hour'")
    await idle_owner.rebalance()
    assert await sweep.run_once() == 1
    assert ready.floor(endpoint) == await db.fetchval("SELECT next_attempt_at FROM deliveries")


# --- gauges -----------------------------------------------------------------


async def _three(db: asyncpg.Connection) -> None:
    """Three endpoints, b and c with a delivery pending that never comes
    due, c's the older; a idle."""
    for name in ("a", "b", "c"):
        await add_endpoint(db, name, "http://127.0.0.1:9/x")
    await hooklane.publish(db, tenant="acme", type="t", data={})
    await db.execute(
        "DELETE FROM deliveries d USING endpoints ep WHERE ep.id = d.endpoint_id AND ep.name = 'a'"
    )
    await db.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'")
    await db.execute(
        "UPDATE deliveries d SET created_at = now() - interval '1 hour' "
        "FROM endpoints ep WHERE ep.id = d.endpoint_id AND ep.name = 'c'"
    )


async def _listed(db: asyncpg.Connection, owner: PartitionOwner) -> ReadyList:
    """The ready list a worker owning ``owner``'s partitions starts from:
    the gauges count the pending deliveries of the endpoints it holds."""
    ready = ReadyList()
    now = datetime.now(UTC)
    for endpoint_id, partition, head in (await store.pending_endpoints(db, sorted(owner.owned))).endpoints:
        ready.listed(endpoint_id, partition, head, now)
    return ready


@pytest.mark.parametrize(("mode", "exported"), [("top", {"c"}), ("all", {"a", "b", "c"}), ("tenant", set())])
async def test_the_gauges_say_how_many_endpoints_they_exported_of_those_owned(
    db, settings, owner, pool, mode, exported
):
    await _three(db)
    gauges = Gauges(
        replace(settings, metrics_endpoints=mode, metrics_endpoints_top=1),
        owner,
        pool,
        await _listed(db, owner),
    )
    assert gauges.period == settings.gauges_seconds
    assert await gauges.run_once() == Exported(exported=len(exported), owned=3)
    series = {
        tuple(s.labels.values())
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "hooklane_endpoint_pending"
    }
    assert series == {("default", name) for name in exported}
    assert _sample("hooklane_endpoints_exported", kind="exported") == len(exported)


async def test_a_worker_owning_nothing_exports_nothing(db, settings, idle_owner, pool):
    await _three(db)
    assert await Gauges(settings, idle_owner, pool, ReadyList()).run_once() == Exported(exported=0, owned=0)


# --- the xmin horizon ---------------------------------------------------------


def _holders() -> list[dict[str, str]]:
    return [
        s.labels
        for family in REGISTRY.collect()
        for s in family.samples
        if s.name == "hooklane_xmin_horizon_holder"
    ]


async def _transaction(dsn: str, application_name: str, sql: str) -> asyncpg.Connection:
    """A session of the application's, left inside the transaction ``sql`` opens."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": application_name})
    await conn.execute(sql)
    return conn


async def _named(watch: HorizonWatch, pid: int | None = None, name: str | None = None) -> HorizonSeen:
    """The first pass that names a holder (with ``pid``, or ``name``)."""

    async def named() -> HorizonSeen | None:
        seen = await watch.run_once()
        holder = seen.holder
        if not seen.named or holder is None or (pid, name) not in ((holder.pid, None), (None, holder.name)):
            return None
        return seen

    return await wait_for(named)


async def test_the_horizon_watch_names_the_oldest_session_holding_the_horizon(dsn, db, settings, owner, pool):
    await db.execute("CREATE TABLE scratch (x int)")
    report = await _transaction(
        dsn, "nightly-report", "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM deliveries"
    )
    forgotten = await _transaction(dsn, "forgotten-session", "BEGIN; INSERT INTO scratch VALUES (1)")
    watch = HorizonWatch(settings, owner, pool)
    assert watch.period == settings.gauges_seconds

    # Seen once: not aged, not named, since a snapshot seen once may be a
    # statement's that is gone by the next pass.
    first = await watch.run_once()
    assert first.holder is not None and first.holder.pid == report.get_server_pid()
    assert (first.housekeeper, first.visible, first.named, first.seconds) == (True, True, False, 0.0)
    assert _holders() == []

    seen = await _named(watch, report.get_server_pid())
    holder = seen.holder
    assert holder is not None
    assert (holder.kind, holder.application_name, holder.usename, holder.state) == (
        "backend",
        "nightly-report",
        "postgres",
        "idle in transaction",
    )
    # The write came after the report's snapshot: one transaction at least.
    assert seen.seconds > 0 and holder.xid_age >= 1 and not seen.refused
    assert _sample("hooklane_xmin_horizon_age_seconds") == seen.seconds
    assert _sample("hooklane_xmin_horizon_age_xids") == holder.xid_age
    assert _sample("hooklane_xmin_horizon_visible") == 1
    assert _holders() == [
        {
            "kind": "backend",
            "pid": str(report.get_server_pid()),
            "usename": "postgres",
            "application_name": "nightly-report",
            "state": "idle in transaction",
            "name": "",
        }
    ]

    # The report ends: the forgotten session's write holds the horizon now.
    await report.close()
    seen = await _named(watch, forgotten.get_server_pid())
    assert seen.holder is not None and seen.holder.application_name == "forgotten-session"
    assert seen.holder.state == "idle in transaction" and seen.seconds > 0
    assert [h["application_name"] for h in _holders()] == ["forgotten-session"]

    await forgotten.close()

    async def let_go() -> HorizonSeen | None:
        seen = await watch.run_once()
        return seen if seen.holder is None or seen.holder.pid != forgotten.get_server_pid() else None

    seen = await wait_for(let_go)
    gone = {"nightly-report", "forgotten-session"}
    assert not gone & {h["application_name"] for h in _holders()}
    if seen.holder is None:
        assert (_sample("hooklane_xmin_horizon_age_seconds"), _holders()) == (0, [])


async def test_a_running_worker_names_the_holder(dsn, start_worker):
    report = await _transaction(
        dsn, "nightly-report", "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM events"
    )
    try:
        metrics.HORIZON_HOLDER.clear()
        start_worker()
        named = [("nightly-report", str(report.get_server_pid()))]
        await wait_for(lambda: [(h["application_name"], h["pid"]) for h in _holders()] == named)
        assert _sample("hooklane_xmin_horizon_age_seconds") > 0
    finally:
        await report.close()


async def test_a_prepared_transaction_holds_the_horizon_until_it_is_finished(dsn, db, settings, owner, pool):
    await db.execute("CREATE TABLE scratch (x int)")
    gid = f"hooklane-test-{uuid.uuid4().hex[:8]}"
    preparer = await _transaction(
        dsn, "two-phase", f"BEGIN; INSERT INTO scratch VALUES (1); PREPARE TRANSACTION '{gid}'"
    )
    # The prepared transaction outlives its session.
    await preparer.close()
    watch = HorizonWatch(settings, owner, pool)
    try:
        seen = await _named(watch, name=gid)
        holder = seen.holder
        assert holder is not None
        assert (holder.kind, holder.pid, holder.usename) == ("prepared_transaction", None, "postgres")
        assert seen.seconds > 0
        assert _holders() == [
            {
                "kind": "prepared_transaction",
                "pid": "",
                "usename": "postgres",
                "application_name": "",
                "state": "",
                "name": gid,
            }
        ]
    finally:
        await db.execute(f"ROLLBACK PREPARED '{gid}'")
    seen = await watch.run_once()
    assert seen.holder is None or seen.holder.name != gid


@pytest.fixture
async def unprivileged_pool(dsn: str, db: asyncpg.Connection) -> AsyncIterator[asyncpg.Pool]:
    """A pool connecting as a role of its own, without pg_read_all_stats."""
    role = f"hooklane_monitor_{uuid.uuid4().hex[:8]}"
    await db.execute(f"CREATE ROLE {role} LOGIN")
    p = await store.create_pool(dsn.replace("postgres@", f"{role}@", 1), min_size=0, max_size=2)
    try:
        yield p
    finally:
        await p.close()
        await db.execute(f"DROP ROLE {role}")


async def test_without_pg_read_all_stats_the_holder_is_named_and_aged_from_first_sight(
    dsn, db, settings, owner, unprivileged_pool, caplog
):
    report = await _transaction(
        dsn, "nightly-report", "BEGIN ISOLATION LEVEL REPEATABLE READ; SELECT 1 FROM events"
    )
    try:
        watch = HorizonWatch(settings, owner, unprivileged_pool)
        with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
            first = await watch.run_once()
            seen = await _named(watch, report.get_server_pid())
        # Another role's session: its pid, role and application, not its
        # state or its transaction's start.
        holder = seen.holder
        assert holder is not None and first.holder is not None
        assert (holder.kind, holder.usename, holder.application_name, holder.state, holder.seconds) == (
            "backend",
            "postgres",
            "nightly-report",
            None,
            None,
        )
        assert seen.visible is False and seen.seconds > 0
        assert _sample("hooklane_xmin_horizon_visible") == 0
        assert [h["state"] for h in _holders()] == [""]
        assert said(caplog) == [
            (
                "the database role cannot see other roles' transactions (grant it pg_read_all_stats): "
                "the xmin horizon's holder is named, its age counts from when this worker first saw it",
                "horizon",
            )
        ]
        assert {t.table for t in seen.tables} == set(store.TABLES)
    finally:
        await report.close()


async def test_a_view_the_role_may_not_read_is_reported_and_the_worker_goes_on(
    db, settings, owner, unprivileged_pool, caplog
):
    await db.execute("REVOKE SELECT ON pg_catalog.pg_prepared_xacts FROM PUBLIC")
    watch = HorizonWatch(settings, owner, unprivileged_pool)
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        seen = await watch.run_once()
        again = await watch.run_once()
    assert seen.refused == ("xmin_horizon refused: permission denied for view pg_prepared_xacts",)
    assert (seen.holder, seen.visible) == (None, False)
    assert {t.table for t in seen.tables} == set(store.TABLES)  # the rest is still read
    assert again.refused == seen.refused
    # Said once, not every pass.
    assert said(caplog) == [
        ("xmin_horizon refused: permission denied for view pg_prepared_xacts; not reported", "horizon")
    ]
    assert _sample("hooklane_xmin_horizon_visible") == 0
    assert REGISTRY.get_sample_value("hooklane_table_live_rows", {"table": "endpoints"}) == 0


async def test_the_horizon_watch_counts_dead_rows_and_vacuums_of_hooklanes_tables_only(
    db, settings, owner, pool
):
    # Read from schema.sql, so that a migration dropping a table drops it here.
    assert {"deliveries", "endpoints", "events", "hooklane_config", "hooklane_migrations"} <= set(
        store.TABLES
    )
    # The application's table, in the same schema, is not Hooklane's.
    await db.execute("CREATE TABLE scratch AS SELECT generate_series(1, 10) AS x; DELETE FROM scratch")
    await db.execute("ALTER TABLE events SET (autovacuum_enabled = off)")
    await add_endpoint(db, "a", "http://127.0.0.1:9/a")
    for _ in range(5):
        await hooklane.publish(db, tenant="acme", type="t", data={})
    await db.execute("DELETE FROM deliveries; DELETE FROM events")
    # rather than the 10 s an idle session waits to report them
    await db.execute("SELECT pg_stat_force_next_flush()")
    watch = HorizonWatch(settings, owner, pool)

    async def counted() -> HorizonSeen | None:
        seen = await watch.run_once()
        events = {t.table: t for t in seen.tables}["events"]
        return seen if events.dead >= 5 else None

    seen = await wait_for(counted)
    assert {t.table for t in seen.tables} == set(store.TABLES)
    events = {t.table: t for t in seen.tables}["events"]
    assert (events.live, events.last_vacuum, events.last_autovacuum, events.autovacuums) == (0, None, None, 0)
    assert _sample("hooklane_table_dead_rows", table="events") == events.dead
    assert REGISTRY.get_sample_value("hooklane_table_dead_rows", {"table": "scratch"}) is None
    assert (
        REGISTRY.get_sample_value("hooklane_table_last_vacuum_timestamp_seconds", {"table": "events"}) is None
    )

    await db.execute("VACUUM events")

    async def vacuumed() -> HorizonSeen | None:
        seen = await watch.run_once()
        events = {t.table: t for t in seen.tables}["events"]
        return seen if events.last_vacuum is not None and events.dead == 0 else None

    seen = await wait_for(vacuumed)
    events = {t.table: t for t in seen.tables}["events"]
    assert events.last_vacuum is not None
    assert (
        _sample("hooklane_table_last_vacuum_timestamp_seconds", table="events")
        == events.last_vacuum.timestamp()
    )
    assert _sample("hooklane_table_dead_rows", table="events") == 0


async def test_a_worker_without_partition_0_reports_no_horizon(settings, idle_owner, pool):
    # What it reported when it held partition 0.
    metrics.HORIZON_AGE.set(900)
    metrics.HORIZON_HOLDER.labels("backend", "7", "app", "report", "active", "").set(1)
    metrics.TABLE_DEAD_ROWS.labels("events").set(5)
    assert await HorizonWatch(settings, idle_owner, pool).run_once() == HorizonSeen()
    assert _sample("hooklane_xmin_horizon_age_seconds") == 0
    assert _holders() == []
    assert REGISTRY.get_sample_value("hooklane_table_dead_rows", {"table": "events"}) is None


# --- keys a publisher held --------------------------------------------------


async def test_busy_keys_stop_without_waiting_out_a_retry(pool, trigger, monkeypatch):
    # A retry an hour away: only the stop can end the wait in time.
    monkeypatch.setattr(ordering, "FIRST_RETRY_SECONDS", 3600.0)
    busy = ordering.BusyKeys(pool, ReadyList(), trigger)
    busy.add([(1, "k")])
    stopping = asyncio.Event()
    running = asyncio.ensure_future(busy.run(stopping))
    await asyncio.sleep(0)  # the loop's first step: into its wait
    assert not running.done()
    stopping.set()
    await asyncio.wait_for(running, timeout=30)

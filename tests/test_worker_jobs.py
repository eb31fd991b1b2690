"""The worker's background jobs, one pass each (``run_once``) on a real
Postgres: what each did, as it says and as the database shows, whom it
woke, and the loop that runs them (hooklane/worker/jobs.py)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator
from dataclasses import replace
from datetime import UTC, datetime

import asyncpg
import pytest
from prometheus_client import REGISTRY

import hooklane
from hooklane import store
from hooklane.errors import DatabaseUnreachable
from hooklane.settings import Settings
from hooklane.worker.jobs import (
    Exported,
    Gauges,
    Maintained,
    Maintenance,
    ReadySweep,
    Rebalanced,
    Rebalancer,
    run_every,
)
from hooklane.worker.partitions import PartitionOwner
from hooklane.worker.ready import ReadyList
from hooklane.worker.trigger import Trigger, Wake
from tests.conftest import add_endpoint, queue_unannounced, reserve_round, wait_for

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


def _said(caplog: pytest.LogCaptureFixture) -> list[tuple[str, object]]:
    return [(r.getMessage(), r.__dict__.get("action")) for r in caplog.records]


# --- the loop ---------------------------------------------------------------


class _Scripted:
    """A job that raises what it is given, one pass at a time, and stops the
    loop after its last."""

    name = "scripted"
    period = 0.0

    def __init__(self, stopping: asyncio.Event, *outcomes: BaseException | None) -> None:
        self._stopping = stopping
        self._outcomes = list(outcomes)
        self.passes = 0

    async def run_once(self) -> None:
        self.passes += 1
        outcome = self._outcomes.pop(0)
        if not self._outcomes:
            self._stopping.set()
        if outcome is not None:
            raise outcome


@pytest.mark.unit
async def test_a_lost_database_is_retried_next_period(caplog):
    stopping = asyncio.Event()
    job = _Scripted(stopping, DatabaseUnreachable("gone"), DatabaseUnreachable("gone"), None)
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        await asyncio.wait_for(run_every(job, stopping), timeout=5)
    assert job.passes == 3
    assert _said(caplog) == [("scripted failed, retrying: gone", "retry")] * 2


@pytest.mark.unit
async def test_any_other_error_stops_the_loop():
    stopping = asyncio.Event()
    job = _Scripted(stopping, None, RuntimeError("a bug"), None)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(run_every(job, stopping), timeout=5)
    assert job.passes == 2 and not stopping.is_set()


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
    assert _said(caplog) == [("requeued 3 deliveries whose worker lost them", "rescue")]
    assert await trigger.wait(0) is Wake.FIRED
    # the ready list has their endpoint due, its queue to be read from the
    # start (this list never read it)
    endpoint = await db.fetchval("SELECT id FROM endpoints")
    assert ready.floor(endpoint) is None  # never read: from the start
    assert ready.scheduled(endpoint)

    trigger.round_starts()
    assert (await maintenance.run_once()).rescued == 0  # the fourth lease is live
    assert await trigger.wait(0) is Wake.POLL


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
    assert _said(caplog) == [
        (
            "endpoint default/old deactivated after failing for 432000 s; its pending deliveries are kept",
            "deactivate",
        )
    ]
    assert await db.fetchval("SELECT state FROM endpoints WHERE name = 'old'") == "deactivated"
    assert await db.fetchval("SELECT count(*) FROM events") == 0
    again = await maintenance.run_once()
    assert (again.deactivated, again.purged) == ((), 0)


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


async def test_the_sweep_says_how_many_endpoints_it_made_ready(db, settings, owner, trigger, caplog):
    endpoint = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await add_endpoint(db, "paused", "http://127.0.0.1:1/p", paused=True)
    await queue_unannounced(db)
    ready = ReadyList()
    sweep = ReadySweep(settings, owner, trigger, ready)
    assert sweep.period == settings.sweep_seconds
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        assert await sweep.run_once() == 1  # not the paused one
    assert _said(caplog) == [("1 endpoints had pending deliveries but were not ready; made ready", "sweep")]
    assert await trigger.wait(0) is Wake.FIRED
    assert [c.endpoint_id for c in ready.take(datetime.now(UTC), 10)] == [endpoint]
    assert ready.floor(endpoint) is None  # read from the start

    trigger.round_starts()
    assert await sweep.run_once() == 0  # in a round now: scheduled
    assert await trigger.wait(0) is Wake.POLL


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


@pytest.mark.parametrize(("mode", "exported"), [("top", {"c"}), ("all", {"a", "b", "c"}), ("tenant", set())])
async def test_the_gauges_say_how_many_endpoints_they_exported_of_those_owned(
    db, settings, owner, pool, mode, exported
):
    await _three(db)
    gauges = Gauges(replace(settings, metrics_endpoints=mode, metrics_endpoints_top=1), owner, pool)
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
    assert await Gauges(settings, idle_owner, pool).run_once() == Exported(exported=0, owned=0)

"""The worker's periodic jobs, their pure parts: a lost database is retried
next period, any other error stops the loop, a holder is timed once seen
again at the same xmin."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

import pytest

from hooklane import store
from hooklane.errors import DatabaseUnreachable
from hooklane.worker.jobs import (
    GAUGE_SLICE_ENDPOINTS,
    gauge_slices,
    held_for,
    run_every,
)
from testsupport.worker_jobs import said


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


async def test_a_lost_database_is_retried_next_period(caplog):
    stopping = asyncio.Event()
    job = _Scripted(stopping, DatabaseUnreachable("gone"), DatabaseUnreachable("gone"), None)
    with caplog.at_level(logging.WARNING, logger="hooklane.worker.jobs"):
        await asyncio.wait_for(run_every(job, stopping), timeout=5)
    assert job.passes == 3
    assert said(caplog) == [("scripted failed, retrying: gone", "retry")] * 2


async def test_any_other_error_stops_the_loop():
    stopping = asyncio.Event()
    job = _Scripted(stopping, None, RuntimeError("a bug"), None)
    with pytest.raises(RuntimeError, match="a bug"):
        await asyncio.wait_for(run_every(job, stopping), timeout=5)
    assert job.passes == 2 and not stopping.is_set()


def _holder(kind: str, *, xmin: int = 700, pid: int | None = 41, seconds: float | None = None):
    return store.HorizonHolder(kind, pid, "app", "report", "idle in transaction", None, xmin, 9, seconds)


def test_a_holder_is_timed_once_a_pass_sees_it_again_at_the_same_xmin():
    # A backend whose transaction began 2 minutes ago: its age, from the second sighting.
    report = _holder("backend", seconds=120.0)
    first, age = held_for(report, None, now=1000.0)
    assert age is None
    again, age = held_for(replace(report, seconds=130.0), first, now=1010.0)
    assert (again, age) == (first, 130.0)
    # Its next statement's snapshot (READ COMMITTED), or another session: seen afresh.
    moved, age = held_for(replace(report, xmin=701, seconds=140.0), again, now=1020.0)
    assert age is None and moved != first
    assert held_for(replace(report, pid=42, seconds=150.0), first, now=1030.0)[1] is None
    # A slot keeps no start: how long it has been seen.
    slot = replace(_holder("replication_slot", pid=None), name="standby_1")
    seen, _ = held_for(slot, None, now=1000.0)
    assert held_for(slot, seen, now=1010.0)[1] == 10.0
    assert held_for(slot, seen, now=1600.0)[1] == 600.0


def test_a_gauge_pass_reads_its_partitions_a_few_hundred_endpoints_at_a_time():
    owned = list(range(32))
    # Not known yet: a partition a slice.
    assert gauge_slices(owned, 0.0) == [[p] for p in owned]
    # 1,800 endpoints over 32 partitions: 4 partitions (225 endpoints) a slice.
    slices = gauge_slices(owned, 1800 / 32)
    assert [len(s) for s in slices] == [4] * 8
    assert [p for s in slices for p in s] == owned
    # Partitions larger than a slice: still one each, never none.
    assert gauge_slices(owned[:3], 10 * GAUGE_SLICE_ENDPOINTS) == [[0], [1], [2]]
    assert gauge_slices([], 50.0) == []

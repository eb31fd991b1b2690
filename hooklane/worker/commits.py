"""How a worker learns of what was published: the commit probe.

A publish sends no notification (migration 0019): a NOTIFY holds
PostgreSQL's one notify lock from its transaction's pre-commit until its
commit is flushed, so every publishing transaction of the instance would
commit one at a time, behind every other. The worker asks instead:
``store.published_since`` returns the endpoints given work by the events
committed since its last probe, found by the transactions that stored them,
so that one committing late, after later ones, is found when it commits.

The probe runs at once when hinted (the API's group commit notifies once per
group, from its own transaction), and otherwise on an interval tied to the
rate events were found at lately (``observed_rate``, ``next_interval``):
more probes than events at a low rate, fewer at a high one, never more
often than every ``probe_min_seconds``, stretching as the rate decays when
none come, up to ``probe_max_seconds``. Once there, the worker probes
sooner only when the snapshot the rebalancer reads every second anyway
shows that a transaction ended since its last probe (``ended_since``): an
idle worker's probe costs Postgres no statement of its own while nothing
commits, and an event published into a quiet database waits about a
rebalance interval.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import time
from collections.abc import Callable

import asyncpg

from hooklane import store
from hooklane.errors import TransientStoreError
from hooklane.settings import Settings

logger = logging.getLogger(__name__)


# How soon the observed rate forgets: an event found this long ago counts
# e^-1 of one found now. After events stop, the interval stretches e-fold
# every two seconds, reaching probe_max_seconds ten seconds or so on,
# having spent about twice the last probes/s in probes.
RATE_MEMORY_SECONDS = 1.0


def observed_rate(rate: float, elapsed: float, found: int) -> float:
    """The rate events were found at lately, in events/s: ``rate`` (the
    last probe's) decayed over the ``elapsed`` seconds since, and the
    ``found`` events of this probe added; an exponentially decaying count,
    so that no history is kept."""
    return rate * math.exp(-elapsed / RATE_MEMORY_SECONDS) + found / RATE_MEMORY_SECONDS


def next_interval(rate: float, pace: float, shortest: float, longest: float) -> float:
    """How long after a probe the next one runs, events being found at
    ``rate`` per second: one over ``sqrt(rate * pace)``, no shorter than
    ``shortest`` and no longer than ``longest`` (none found lately).

    A probe costs the worker and Postgres about 0.6 ms of CPU together,
    whatever it finds, most of it two processes waking (docs/benchmarks.md,
    section 15), and an event waits for the next probe, half an interval
    on average. Probing ``sqrt(rate * pace)`` times a second makes the sum
    of the two, weighed as ``pace`` says, lowest: one probe per event at
    ``rate == pace``, more below it, fewer above it. With a pace of 200:
    45 probes/s at 10 events/s (an event waits ~11 ms), 141/s at 100
    events/s (~3.5 ms: the p50 asked there is 10 ms, the round included),
    every ``shortest`` (5 ms) from 200 events/s.
    Doubling after each empty probe, as the probe first did, spent 50
    probes/s at 10 events/s, most of them just after an event, when none
    was coming, and left events waiting ~27 ms."""
    probes = math.sqrt(rate * pace)
    if probes * longest <= 1.0:
        return longest
    return max(shortest, 1.0 / probes)


def _snapshot(text: str) -> tuple[int, frozenset[int]]:
    """A pg_snapshot's text ("xmin:xmax:xip,xip,..."): its xmax and the
    transactions it saw running."""
    _xmin, xmax, running = text.split(":")
    return int(xmax), frozenset(int(x) for x in running.split(",") if x)


def ended_since(since: str | None, now: str) -> bool:
    """Whether a transaction that ``since`` did not see (it began later, or
    was running) has ended, committed or not, by ``now``: only then can a
    probe from ``since`` find anything."""
    if since is None:
        return True
    xmax_then, running_then = _snapshot(since)
    xmax_now, running_now = _snapshot(now)
    if any(x < xmax_now and x not in running_now for x in running_then):
        return True
    # Of the transactions begun since, how many still run.
    begun_running = sum(1 for x in running_now if x >= xmax_then)
    return xmax_now - xmax_then > begun_running


class CommitProbe:
    """The probe of one worker, on its pool; ``found`` is told what each
    probe found."""

    def __init__(
        self, settings: Settings, pool: asyncpg.Pool, found: Callable[[store.Committed], None]
    ) -> None:
        self._shortest = settings.probe_min_seconds
        self._longest = max(settings.probe_max_seconds, self._shortest)
        self._pace = settings.probe_pace
        self._pool = pool
        self._found = found
        self._hinted = asyncio.Event()
        self._since: str | None = None
        self._io = asyncio.Lock()
        self._rate = 0.0
        self._probed_at = time.monotonic()
        self.interval = self._shortest

    def hinted(self) -> None:
        """Something was published: probe now."""
        self._hinted.set()

    def seen(self, snapshot: str) -> None:
        """The database's snapshot, as the rebalancer read it (every
        second): probe now if a transaction ended since the last probe,
        which may have been one that published."""
        if ended_since(self._since, snapshot):
            self._hinted.set()

    async def start(self) -> None:
        """Take the first snapshot: events committed after it are found by
        the probes, those before by the listing of each partition taken,
        which runs later."""
        self._since = (await self._probe()).snapshot

    async def run(self, stopping: asyncio.Event) -> None:
        """Probe until ``stopping``. A probe that fails keeps its snapshot,
        so the next one finds what it would have."""
        while not stopping.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._hinted.wait(), timeout=self.interval)
            self._hinted.clear()
            if stopping.is_set():
                return
            try:
                await self.catch_up()
            except TransientStoreError as exc:
                logger.warning("probe failed, retrying: %s", exc, extra={"action": "retry"})
                self.interval = min(self._longest, max(self.interval, self._shortest) * 2)

    async def catch_up(self) -> None:
        """Probe now: once it returns, ``found`` was told of everything
        committed before it was called. The sweep calls it after listing
        the queues, so that what it lists and the ready list lacks was lost,
        not published since the last probe."""
        async with self._io:
            committed = await self._probe()
            now = time.monotonic()
            self._rate = observed_rate(self._rate, now - self._probed_at, committed.events)
            self._probed_at = now
            self._since = committed.snapshot
            self.interval = next_interval(self._rate, self._pace, self._shortest, self._longest)
            if committed.endpoints:
                self._found(committed)

    async def _probe(self) -> store.Committed:
        async with store.acquire(self._pool) as conn:
            return await store.published_since(conn, self._since)

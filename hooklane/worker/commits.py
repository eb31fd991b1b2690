"""How a worker learns of what was published: the commit probe.

A publish sends no notification (migration 0019): a NOTIFY holds
PostgreSQL's one notify lock from its transaction's pre-commit until its
commit is flushed, so every publishing transaction of the instance would
commit one at a time, behind every other. The worker asks instead:
``store.published_since`` returns the endpoints given work by the events
committed since its last probe, found by the transactions that stored them,
so that one committing late, after later ones, is found when it commits.

While events come, the worker waits for them in PostgreSQL
(``store.await_published``, migration 0022): one call sleeps a list of
pauses there, probing after each only if a transaction began or ended, and
returns at the first event found. A probe sent from the worker woke two
processes, the worker and its backend, for about 0.6 ms of CPU whatever it
found; a pause in PostgreSQL wakes the backend alone, and the worker only
when there is something to deliver. The pauses follow the rate events were
found at lately (``observed_rate``, ``wait_pauses``): more probes than
events at a low rate, fewer at a high one, never more often than every
``probe_min_seconds``, stretching as the rate decays when none come.

Once a pause would reach the rebalancer's period, the worker stops waiting
there and probes when the snapshot the rebalancer reads every second
anyway shows that a transaction ended since its last probe
(``ended_since``), and at the latest every ``probe_max_seconds``: an idle
worker costs Postgres no statement of its own while nothing commits, and an
event published into a quiet database waits about a rebalance interval.
The API's group commit notifies once per group, from its own transaction:
the worker probes at once.
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

# A wait in PostgreSQL returns within this, found or not, and after this
# many pauses; the next one starts from the rate decayed meanwhile.
# Monitoring that flags statements running for seconds should not see the
# probe as one, and while events come a wait returns at its first pause or
# so: a longer list would be computed and sent for nothing (200 times a
# second at 500 events/s).
WAIT_SECONDS = 2.0
WAIT_PAUSES = 64


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

    A probe costs about the same whatever it finds, and an event waits for
    the next one, half an interval on average. Probing ``sqrt(rate *
    pace)`` times a second makes the sum of the two, weighed as ``pace``
    says, lowest: one probe per event at ``rate == pace``, more below it,
    fewer above it. With a pace of 200: 45 probes/s at 10 events/s (an
    event waits ~11 ms), 141/s at 100 events/s (~3.5 ms: the p50 asked
    there is 10 ms, the round included), every ``shortest`` (5 ms) from
    200 events/s (docs/benchmarks.md, section 15)."""
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


def wait_pauses(
    rate: float, pace: float, shortest: float, idle: float, budget: float, most: int = WAIT_PAUSES
) -> list[float]:
    """The pauses of one wait in PostgreSQL, events having been found at
    ``rate`` per second until it starts: each the interval ``next_interval``
    gives for the rate as it decays over the pauses before it, none being
    found meanwhile, while that is shorter than ``idle``, the pauses add up
    to ``budget`` at most and number ``most`` at most. Empty when the first would be ``idle`` or
    longer: the worker then waits for a sign that a transaction ended."""
    pauses: list[float] = []
    waited = 0.0
    while True:
        decayed = rate * math.exp(-waited / RATE_MEMORY_SECONDS)
        pause = next_interval(decayed, pace, shortest, idle)
        if pause >= idle or waited + pause > budget or len(pauses) == most:
            return pauses
        pauses.append(pause)
        waited += pause


class CommitProbe:
    """The probe of one worker, on its pool; ``found`` is told what each
    probe found."""

    def __init__(
        self, settings: Settings, pool: asyncpg.Pool, found: Callable[[store.Committed], None]
    ) -> None:
        self._shortest = settings.probe_min_seconds
        self._longest = max(settings.probe_max_seconds, self._shortest)
        # Pauses in PostgreSQL stop short of the rebalancer's period: from
        # there on, its snapshot tells when to probe, for no statement.
        self._idle = max(settings.rebalance_seconds, self._shortest)
        self._pace = settings.probe_pace
        self._pool = pool
        self._found = found
        self._hinted = asyncio.Event()
        self._waiting = False
        self._since: str | None = None
        self._io = asyncio.Lock()
        self._rate = 0.0
        self._probed_at = time.monotonic()
        self._retry = self._shortest

    def hinted(self) -> None:
        """Something was published: probe now."""
        self._hinted.set()

    def seen(self, snapshot: str) -> None:
        """The database's snapshot, as the rebalancer read it (every
        second): probe now if a transaction ended since the last probe,
        which may have been one that published. A wait in PostgreSQL
        notices that itself."""
        if not self._waiting and ended_since(self._since, snapshot):
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
            rate = observed_rate(self._rate, time.monotonic() - self._probed_at, 0)
            pauses = wait_pauses(rate, self._pace, self._shortest, self._idle, WAIT_SECONDS)
            try:
                if pauses:
                    await self._wait(pauses)
                else:
                    await self._quiet(stopping)
                self._retry = self._shortest
            except TransientStoreError as exc:
                logger.warning("probe failed, retrying: %s", exc, extra={"action": "retry"})
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stopping.wait(), timeout=self._retry)
                self._retry = min(self._longest, self._retry * 2)

    async def _quiet(self, stopping: asyncio.Event) -> None:
        """No event lately: probe once, when hinted or a transaction ended,
        or after ``probe_max_seconds``."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._hinted.wait(), timeout=self._longest)
        self._hinted.clear()
        if not stopping.is_set():
            await self.catch_up()

    async def _wait(self, pauses: list[float]) -> None:
        """Wait in PostgreSQL through ``pauses``; probe at once, beside it,
        when hinted meanwhile."""
        since = self._since
        assert since is not None, "run before start"
        self._waiting = True
        waiting = asyncio.ensure_future(self._await(since, pauses))
        try:
            while not waiting.done():
                hinted = asyncio.ensure_future(self._hinted.wait())
                await asyncio.wait({waiting, hinted}, return_when=asyncio.FIRST_COMPLETED)
                if hinted.done():
                    self._hinted.clear()
                    await self.catch_up()
                else:
                    hinted.cancel()
        finally:
            self._waiting = False
            waiting.cancel()
        self._took(waiting.result())

    async def _await(self, since: str, pauses: list[float]) -> store.Committed:
        async with store.acquire(self._pool) as conn:
            return await store.await_published(conn, since, pauses)

    async def catch_up(self) -> None:
        """Probe now: once it returns, ``found`` was told of everything
        committed before it was called. The sweep calls it before listing
        the queues, so that what it lists and the ready list lacks was lost,
        not published since the last probe. Safe beside a wait in
        PostgreSQL: whichever answers last leaves its snapshot to the next
        probe, which at worst reads again what the other one found."""
        async with self._io:
            self._took(await self._probe())

    def _took(self, committed: store.Committed) -> None:
        now = time.monotonic()
        self._rate = observed_rate(self._rate, now - self._probed_at, committed.events)
        self._probed_at = now
        self._since = committed.snapshot
        if committed.endpoints:
            self._found(committed)

    async def _probe(self) -> store.Committed:
        async with store.acquire(self._pool) as conn:
            return await store.published_since(conn, self._since)

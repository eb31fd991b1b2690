"""When the worker's reservation runs a round, and when its recorder writes.

A round costs Postgres about the same for one delivery as for many, so the
reservation runs one only when it may find something. Whatever may give it
work fires the trigger, through a method named for what happened; the
reservation waits on it between rounds, and the recorder waits on it for
the results an endpoint waits for. The rule is the paragraph on the
worker's rounds in docs/state-machine.md ("Ready endpoints").
"""

from __future__ import annotations

import asyncio
import contextlib
from enum import Enum

# How often rounds may start while slots are plentiful (round_pause). A
# wakeup after a quiet spell is not delayed, so latency when idle is not
# either; at a steady rate an event waits half of this on average.
_ROUND_INTERVAL = 0.008


def round_pause(since_last: float, in_flight: int, concurrency: int) -> float:
    """How long a woken reservation waits before its round. A round costs
    Postgres about the same for one delivery as for many, and at an everyday
    rate every publish wakes the worker on its own: rounds start at most once
    per ``_ROUND_INTERVAL``, so that the wakeups within it share one. A worker
    woken after a quiet spell goes at once (latency when idle), and one using
    half its slots or more never waits: freed slots are its throughput."""
    if in_flight * 2 >= concurrency:
        return 0.0
    return max(0.0, _ROUND_INTERVAL - since_last)


def slot_freed_matters(in_flight: int, concurrency: int) -> bool:
    """Whether a delivery that just finished, leaving ``in_flight``, should
    wake the reservation: only if the worker was at its limit, when rounds
    stop until a slot frees. Below it, the slot changes nothing a round would
    find; the endpoint's own slot is the recorded result's to announce."""
    return in_flight + 1 >= concurrency


class Wake(Enum):
    """Why the reservation's wait between rounds ended."""

    POLL = "poll"  # nothing fired: the poll, for due retries and ended pauses
    FIRED = "fired"  # something may have given the worker work
    READY = "ready"  # an endpoint ready now (a recorded result, a probe): no pause


class Trigger:
    """The worker's wakeups, for a worker of ``concurrency`` slots."""

    def __init__(self, concurrency: int) -> None:
        self.concurrency = concurrency
        self._fired = asyncio.Event()
        self._ready = False
        self._awaited = asyncio.Event()

    # What happened: each may give the reservation work.

    def published(self) -> None:
        """A notification named a partition this worker owns: something of
        Hooklane's own (a resend, a replay, an endpoint changed) queued work."""
        self._fired.set()

    def probed(self) -> None:
        """The commit probe found work for this worker's partitions. The
        probe's interval already gathered what was published meanwhile into
        one answer, so the round need not wait for more to share it."""
        self._ready = True
        self._fired.set()

    def partitions_taken(self) -> None:
        """A rebalance gave this worker partitions, and their endpoints."""
        self._fired.set()

    def work_found(self) -> None:
        """A rescue or the sweep made endpoints ready."""
        self._fired.set()

    def slot_freed(self, in_flight: int) -> None:
        """A delivery finished, leaving ``in_flight``."""
        if slot_freed_matters(in_flight, self.concurrency):
            self._fired.set()

    def long_slot_freed(self) -> None:
        """A call in the long budget ended while slow endpoints wait for
        room there."""
        self._fired.set()

    def endpoint_ready(self) -> None:
        """Recorded results left an endpoint ready now: its delivery is due
        and its slot free, so the round need not wait to share."""
        self._ready = True
        self._fired.set()

    def stopping(self) -> None:
        """The worker stops: the reservation loop is to see it at once."""
        self._fired.set()

    # The reservation loop.

    def round_starts(self) -> None:
        """A round is about to start: it sees whatever fired until now."""
        self._fired.clear()
        self._ready = False

    async def wait(self, timeout: float) -> Wake:
        """Until the trigger fires, or ``timeout`` seconds (the poll)."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._fired.wait(), timeout=timeout)
        if self._ready:
            return Wake.READY
        return Wake.FIRED if self._fired.is_set() else Wake.POLL

    def pause(self, wake: Wake, since_last: float, in_flight: int) -> float:
        """How long the round after ``wake`` waits: ``round_pause``, or not at
        all for an endpoint ready now."""
        if wake is Wake.READY:
            return 0.0
        return round_pause(since_last, in_flight, self.concurrency)

    # The recorder.

    def result_awaited(self) -> None:
        """A result was queued whose endpoint this worker holds at its limit:
        the endpoint's next delivery waits for it to be written."""
        self._awaited.set()

    async def record_window(self, timeout: float) -> bool:
        """Let queued results wait up to ``timeout`` seconds for company,
        less if one is awaited; True if one was. The next window starts
        afresh."""
        if timeout > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._awaited.wait(), timeout=timeout)
        awaited = self._awaited.is_set()
        self._awaited.clear()
        return awaited

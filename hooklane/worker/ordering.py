"""Ordering keys a publisher held when their head's result was recorded.

Recording a result moves its key on in the same transaction, but never
waits for a publishing transaction that holds the key's row: that would
hold every result of the worker behind an application's commit
(``hooklane_ordering_advance_v1`` skips the row, and ``complete`` returns
the key as busy). This worker then tries again, soon and then less often,
until the publisher's transaction has ended and the key moved on; the
maintenance pass's sweep catches a key this process dies holding.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Iterable
from datetime import UTC, datetime

import asyncpg

from hooklane import store
from hooklane.errors import TransientStoreError
from hooklane.worker.ready import ReadyList
from hooklane.worker.trigger import Trigger

logger = logging.getLogger(__name__)

# A publishing transaction usually ends within milliseconds of its
# publish: the first try comes that soon, and the wait doubles up to a
# second while it goes on.
FIRST_RETRY_SECONDS = 0.01
LAST_RETRY_SECONDS = 1.0


def next_retry(delay: float) -> float:
    """The wait after a try that found keys still held."""
    return min(delay * 2, LAST_RETRY_SECONDS)


async def first_of(*events: asyncio.Event) -> None:
    """Until one of ``events`` is set: an idle worker wakes for nothing."""
    waits = [asyncio.ensure_future(e.wait()) for e in events]
    try:
        await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for w in waits:
            w.cancel()
        await asyncio.wait(waits)


class BusyKeys:
    """The (endpoint, key) pairs to move on once their publisher commits."""

    def __init__(self, pool: asyncpg.Pool, ready: ReadyList, trigger: Trigger) -> None:
        self._pool = pool
        self._ready = ready
        self._trigger = trigger
        self._keys: set[tuple[int, str]] = set()
        self._added = asyncio.Event()

    def add(self, keys: Iterable[tuple[int, str]]) -> None:
        before = len(self._keys)
        self._keys.update(keys)
        if len(self._keys) > before:
            self._added.set()

    async def run(self, stopping: asyncio.Event) -> None:
        delay = FIRST_RETRY_SECONDS
        while not stopping.is_set():
            if not self._keys:
                delay = FIRST_RETRY_SECONDS
                await first_of(self._added, stopping)
                self._added.clear()
                continue
            # A worker stopping leaves the keys to the next owner's sweep
            # rather than wait out a retry.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stopping.wait(), delay)
            if stopping.is_set():
                return
            keys, self._keys = self._keys, set()
            try:
                async with store.acquire(self._pool) as conn:
                    promoted, busy = await store.advance_ordering(conn, sorted(keys))
            except TransientStoreError as exc:
                logger.warning(
                    "moving ordering keys on failed, retrying: %s", exc, extra={"action": "ordering"}
                )
                self._keys |= keys
                delay = next_retry(delay)
                continue
            now = datetime.now(UTC)
            for endpoint_id, partition, due in promoted:
                self._ready.wake(endpoint_id, partition, due, now)
            if promoted:
                self._trigger.work_found()
            self._keys.update(busy)
            delay = next_retry(delay) if busy else FIRST_RETRY_SECONDS

"""Partition ownership through session-level advisory locks.

Each endpoint belongs to one partition; each partition is owned by at most one
live worker, the one whose lock connection holds its advisory lock. Every
reservation in a partition runs on that same connection, so if the connection
dies the lock goes with it and no reservation can run without it. That is what
keeps per-endpoint concurrency exact across replicas.

Workers find each other through a second kind of advisory lock, one per worker
("member"), held on the same connection: counting those in pg_locks tells the
live workers at once, with no heartbeat table to expire.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import asyncpg

from hooklane import store
from hooklane.errors import DatabaseUnreachable
from hooklane.worker.ready import Wakeup, parse_wakeup

logger = logging.getLogger(__name__)

# Advisory lock classes (the first int4 key); the second key is the partition
# number or the worker's member id. Both read "hl" + a letter in hex.
PARTITION_CLASS = 0x686C70  # "hlp"
MEMBER_CLASS = 0x686C6D  # "hlm"

# The payload of store.hint_published: something was published, probe now.
PUBLISHED_HINT = "published"

# Reservation, rescue and rebalancing take milliseconds; far longer means the
# server or the network is gone.
_CALL_TIMEOUT_SECONDS = 30.0

T = TypeVar("T")


def fair_share(partition_count: int, live_workers: int) -> int:
    """How many partitions one worker should own: the ceiling, so that the
    shares always cover every partition."""
    return math.ceil(partition_count / max(live_workers, 1))


def preference(partition_count: int, member_id: int) -> list[int]:
    """The order in which a worker tries partitions: a rotation that starts
    somewhere different for each worker, so that workers joining together do
    not all contend for partition 0 first."""
    start = member_id % partition_count
    return [(start + i) % partition_count for i in range(partition_count)]


class LostOwnership(Exception):
    """The lock connection failed; every partition lock is gone with it."""


class PartitionOwner:
    def __init__(
        self,
        dsn: str,
        partition_count: int,
        on_notify: Callable[[Wakeup], None],
        on_hint: Callable[[], None] | None = None,
        on_snapshot: Callable[[str], None] | None = None,
    ) -> None:
        self._dsn = dsn
        self.partition_count = partition_count
        self._on_notify = on_notify
        self._on_hint = on_hint
        self._on_snapshot = on_snapshot
        self._conn: asyncpg.Connection | None = None
        self._io = asyncio.Lock()
        self.member_id = 0
        self.owned: set[int] = set()
        # Counts lock connections: what was learnt of the partitions under
        # one (a listing of their queues) says nothing of what was published
        # while no connection listened, before the next one took them.
        self.generation = 0
        # True once a rebalance on the current lock connection has taken this
        # worker's fair share, or every partition it could: the worker then
        # owns what it should (possibly nothing) and is ready.
        self.settled = False

    async def connect(self) -> None:
        """Open the lock connection, register as a live worker, listen. Does
        nothing while the current connection is alive, so that the loops
        noticing a lost connection at the same time open only one."""
        async with self._io:
            if self._conn is not None and not self._conn.is_closed():
                return
            # The application name ties the backend holding the locks to this
            # process, for operators reading pg_stat_activity and pg_locks.
            conn = await store.connect(
                self._dsn,
                # A call that gets no answer means a connection that cannot
                # be trusted with ownership any more: it is dropped.
                command_timeout=_CALL_TIMEOUT_SECONDS,
                server_settings={
                    **store.WORKER_SESSION,
                    "application_name": f"hooklane-worker:{os.getpid()}",
                },
            )
            while True:
                member_id = random.randrange(1, 2**31)
                if await store.try_lock(conn, MEMBER_CLASS, member_id):
                    break
            await conn.add_listener("hooklane_ready", self._notified)
            self._conn, self.member_id, self.owned, self.settled = conn, member_id, set(), False
            self.generation += 1
        logger.info("worker %d joined", member_id, extra={"action": "join", "member": member_id})

    def _notified(self, _conn: object, _pid: int, _channel: str, payload: str) -> None:
        if payload == PUBLISHED_HINT:
            if self._on_hint is not None:
                self._on_hint()
            return
        wakeup = parse_wakeup(payload)
        if wakeup is not None and wakeup.partition in self.owned:
            self._on_notify(wakeup)

    async def run(self, fn: Callable[[asyncpg.Connection, list[int]], Awaitable[T]]) -> T:
        """Run ``fn(conn, owned)`` on the lock connection while ownership holds."""
        async with self._io:
            conn = self._require()
            try:
                return await fn(conn, sorted(self.owned))
            except DatabaseUnreachable as exc:
                self._drop(exc)
                raise LostOwnership(str(exc)) from exc

    async def rebalance(self) -> tuple[set[int], set[int]]:
        """Take or release partitions towards this worker's fair share.
        Returns (taken, released)."""
        async with self._io:
            conn = self._require()
            try:
                return await self._rebalance(conn)
            except DatabaseUnreachable as exc:
                self._drop(exc)
                raise LostOwnership(str(exc)) from exc

    async def _rebalance(self, conn: asyncpg.Connection) -> tuple[set[int], set[int]]:
        live, snapshot = await store.live_workers(conn, MEMBER_CLASS)
        if self._on_snapshot is not None:
            self._on_snapshot(snapshot)
        target = fair_share(self.partition_count, live)
        taken: set[int] = set()
        released: set[int] = set()
        order = preference(self.partition_count, self.member_id)
        if len(self.owned) > target:
            # Give up the ones furthest along our own preference order.
            for partition in reversed(order):
                if len(self.owned) <= target:
                    break
                if partition in self.owned:
                    await store.unlock(conn, PARTITION_CLASS, partition)
                    self.owned.discard(partition)
                    released.add(partition)
        else:
            for partition in order:
                if len(self.owned) >= target:
                    break
                if partition not in self.owned and await store.try_lock(conn, PARTITION_CLASS, partition):
                    self.owned.add(partition)
                    taken.add(partition)
        self.settled = True
        if taken or released:
            logger.info(
                "partitions rebalanced: %d owned of %d, %d live workers",
                len(self.owned),
                self.partition_count,
                live,
                extra={"action": "rebalance", "taken": sorted(taken), "released": sorted(released)},
            )
        return taken, released

    def _require(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            raise LostOwnership("no lock connection")
        return self._conn

    def _drop(self, exc: BaseException) -> None:
        logger.warning(
            "lock connection lost, giving up %d partitions: %s",
            len(self.owned),
            exc,
            extra={"action": "lost_ownership"},
        )
        self.owned, self.settled = set(), False
        if self._conn is not None:
            self._conn.terminate()
        self._conn = None

    async def close(self) -> None:
        """Release every lock by closing the session."""
        async with self._io:
            if self._conn is not None and not self._conn.is_closed():
                # bounded: a server that stopped answering must not hold up the exit
                await self._conn.close(timeout=5.0)
            self._conn = None
            self.owned, self.settled = set(), False

"""Chaos harness (issue 7): a running system, faults injected into it, and the
two invariants checked over the whole run.

Shared by tests/processes/test_chaos.py (short runs) and bench/chaos.py (long runs).
Everything is real: a PostgreSQL server this harness restarts, ``hooklane
worker`` processes, an aiohttp receiver on loopback, and a publisher that
commits events at a steady rate on a connection of its own.

The invariants, over every event whose transaction committed:
- nothing lost: each endpoint the event matches received it at least once,
  or its delivery is dead with a recorded reason;
- exact limits: no endpoint ever had more calls in flight at its receiver
  than its maxConcurrency;
- order per key (issue 42), when the scenario publishes ordered events:
  for each endpoint and key, the sequence numbers the receiver got never
  go down (a repeat is only ever of the latest), every number the key was
  given reached it (or its delivery is dead with a reason), and no two
  calls of a key were in flight at the receiver at once.
Duplicates are expected (at least once) and counted, not failed on. A worker
process that exits without the harness having killed it fails the run.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Sequence
from contextlib import AsyncExitStack, suppress
from dataclasses import asdict, dataclass, field
from itertools import pairwise
from pathlib import Path
from typing import Any

import asyncpg
import psutil

import hooklane
from hooklane import store
from hooklane.dev.postgres import LocalPostgres
from hooklane.spec import EndpointSpec
from hooklane.store.connection import TRANSIENT
from hooklane.worker.partitions import MEMBER_CLASS, PARTITION_CLASS
from testsupport import timings
from testsupport.databases import create_database, drop_database
from testsupport.receivers import Answer, Receiver, numbers_by_key, order_broken

REPO = Path(__file__).resolve().parent.parent
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
NAMESPACE = "chaos"
TENANTS = ("acme", "globex")
TYPES = ("order.created", "order.updated", "invoice.paid")
FAULT_KINDS = ("kill", "term", "pg-fast", "pg-immediate", "terminate")
# Errors after which a connection of the harness is reopened and the call
# tried again; anything else is a bug in the harness or in Hooklane. A
# connection used right after the server ended it raises asyncpg's
# InternalClientError ("cannot switch to state 15; another operation (2) is
# in progress", MagicStack/asyncpg#784) about as often as a proper
# connection error: any application publishing through asyncpg sees it.
LOST = (*TRANSIENT, asyncpg.PostgresConnectionError, asyncpg.exceptions.InternalClientError)


# --------------------------------------------------------------------------
# Endpoints


@dataclass(frozen=True)
class Endpoint:
    """An endpoint of the run and how its receiver behaves: the healthy
    receiver answers 204 after ``delay``; ``hostile`` names a HostileServer
    mode instead."""

    name: str
    tenant: str
    max_concurrency: int
    delay: float = 0.01
    event_types: tuple[str, ...] = ()
    timeout_seconds: int = 2
    hostile: str | None = None

    @property
    def path(self) -> str:
        return "/" + self.name


# Receiver delays are short next to the 2 s whole-call deadline, so a call
# the worker abandons (timeout) never overlaps its replacement at the
# receiver, which would read as a limit broken. Capacities are well above the
# steady load, so backlogs after a fault drain, and while they do the
# endpoints with small limits run full: their peaks then test the limit.
HEALTHY = (
    Endpoint("a-wide", "acme", max_concurrency=4, delay=0.01),
    Endpoint("a-orders", "acme", max_concurrency=2, delay=0.05, event_types=("order.*",)),
    Endpoint("a-created", "acme", max_concurrency=1, delay=0.02, event_types=("order.created",)),
    Endpoint("g-wide", "globex", max_concurrency=8, delay=0.005),
    Endpoint(
        "g-invoices", "globex", max_concurrency=3, delay=0.05, event_types=("invoice.paid", "invoice.*")
    ),
    # Slow answers keep calls in flight most of the time, so a killed worker
    # leaves deliveries behind for the lease to rescue.
    Endpoint("g-slow", "globex", max_concurrency=4, delay=0.3, event_types=("invoice.paid",)),
)


def hostile_endpoint(mode: str, tenant: str) -> Endpoint:
    """An endpoint answered by HostileServer in ``mode``. It shares the
    tenant's invoice events with healthy endpoints, a third of the tenant's
    traffic: with a 1 s deadline and 8 slots even a receiver that never
    answers gets through its share within a run (see HOSTILE_WORKER_ENV)."""
    return Endpoint(
        "hostile-" + mode.replace("_", "-"),
        tenant,
        max_concurrency=8,
        event_types=("invoice.paid",),
        timeout_seconds=1,
        hostile=mode,
    )


# For the hostile scenario: two attempts, and circuit pauses short enough
# that hostile deliveries reach their end (dead) within a run rather than
# queueing behind a paused endpoint; the breaker still opens and probes.
HOSTILE_WORKER_ENV = (
    ("HOOKLANE_RETRY_MAX_ATTEMPTS", "2"),
    ("HOOKLANE_CIRCUIT_STEP_SECONDS", "0.1"),
    ("HOOKLANE_CIRCUIT_CAP_SECONDS", "0.2"),
)


def matches(endpoint: Endpoint, tenant: str, event_type: str) -> bool:
    """The routing rule of the contract, written again here so that the
    expected deliveries do not come from the code under test."""
    if endpoint.tenant != tenant:
        return False
    if not endpoint.event_types:
        return True
    return any(
        p == "*" or p == event_type or (p.endswith(".*") and event_type.startswith(p[:-1]))
        for p in endpoint.event_types
    )


# --------------------------------------------------------------------------
# PostgreSQL


def _as_postgres() -> list[str]:
    # LocalPostgres runs the server as the postgres user when we are root;
    # pg_ctl must run as that user too.
    return ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []


def local_postgres() -> LocalPostgres:
    """A server for chaos runs: durable (fsync and synchronous commit on)
    where LocalPostgres offers it, since an immediate shutdown is a crash and
    the run counts what survived it."""
    if "durable" in inspect.signature(LocalPostgres).parameters:
        return LocalPostgres(durable=True)
    return LocalPostgres()


def restart_postgres(pg: LocalPostgres, mode: str, timeout: float = 120.0) -> None:
    """``pg_ctl restart -m fast|immediate`` on the same port and options.
    Immediate is a crash as far as the data is concerned: the start runs
    crash recovery."""
    subprocess.run(
        [
            *_as_postgres(),
            str(pg.bindir / "pg_ctl"),
            "-D",
            str(pg.datadir),
            # -l again: without it the new postmaster writes to, and holds
            # open, our stdout.
            "-l",
            str(pg.dir / "server.log"),
            "-m",
            mode,
            "-w",
            "-t",
            "90",
            "restart",
        ],
        check=True,
        cwd=pg.dir,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        timeout=timeout,
    )


class Control:
    """The harness's own connection, for its questions to the database. It
    reopens after a restart or a termination (it is never a target itself)."""

    def __init__(self, dsn: str) -> None:
        self.dsn = dsn
        self._conn: asyncpg.Connection | None = None

    async def call(self, fn: Callable[[asyncpg.Connection], Awaitable[Any]], timeout: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            try:
                if self._conn is None or self._conn.is_closed():
                    self._conn = await asyncpg.connect(
                        self.dsn,
                        timeout=5,
                        command_timeout=10,
                        server_settings={"application_name": "chaos-control"},
                    )
                return await fn(self._conn)
            except LOST:
                await self._drop()
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)

    async def fetch(self, sql: str, *args: object) -> list[asyncpg.Record]:
        return await self.call(lambda c: c.fetch(sql, *args))

    async def fetchval(self, sql: str, *args: object) -> Any:
        return await self.call(lambda c: c.fetchval(sql, *args))

    async def _drop(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
        self._conn = None

    async def close(self) -> None:
        if self._conn is not None and not self._conn.is_closed():
            await self._conn.close()
        self._conn = None


async def create_endpoints(
    conn: asyncpg.Connection, endpoints: Sequence[Endpoint], urls: dict[str, str]
) -> None:
    for ep in endpoints:
        spec = EndpointSpec(
            namespace=NAMESPACE,
            name=ep.name,
            url=urls[ep.name],
            tenant=ep.tenant,
            max_concurrency=ep.max_concurrency,
            event_types=ep.event_types,
            timeout_seconds=ep.timeout_seconds,
        )
        await store.upsert_endpoint(conn, spec, SECRET)


# --------------------------------------------------------------------------
# Workers


def worker_env(dsn: str, **overrides: str) -> dict[str, str]:
    """The tests' short timers (testsupport/timings.py), so that a run notices and
    repairs faults in seconds; quick retries and a short circuit pause so
    that a failing endpoint's deliveries reach their end (dead) within a
    run; and loopback allowed, where every receiver of a run listens."""
    return {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_METRICS_PORT": "0",
        "HOOKLANE_ALLOWED_NETWORKS": "127.0.0.0/8,::1/128",
        **timings.environment(timings.WORKER),
        "HOOKLANE_DRAIN_SECONDS": "10",
        "HOOKLANE_RETRY_BASE_SECONDS": "0.5",
        "HOOKLANE_RETRY_MAX_ATTEMPTS": "4",
        "HOOKLANE_CIRCUIT_STEP_SECONDS": "1",
        "HOOKLANE_CIRCUIT_CAP_SECONDS": "2",
        **overrides,
    }


@dataclass
class WorkerRun:
    proc: subprocess.Popen
    log: Path
    started: float
    # Why the harness ended it ("SIGKILL", "SIGTERM", "stop"); None while any
    # exit would be unexpected.
    ended_by: str | None = None
    signalled_at: float | None = None
    exit_code: int | None = None
    exited_at: float | None = None
    rss: list[tuple[float, int]] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid


@dataclass(frozen=True)
class WorkerFailure:
    pid: int
    exit_code: int | None
    at_s: float
    why: str
    stderr_tail: str


def tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class Workers:
    """The worker processes of a run. The harness replaces the ones it kills
    (as a Deployment would) and never the ones that die on their own: that
    would hide the very crash the run is looking for."""

    def __init__(self, dsn: str, logdir: Path, t0: float, env: dict[str, str] | None = None) -> None:
        self._env = worker_env(dsn, **(env or {}))
        self._logdir = logdir
        self._t0 = t0
        self.all: list[WorkerRun] = []
        self.failures: list[WorkerFailure] = []

    def start(self, **env: str) -> WorkerRun:
        """One more worker; ``env`` adds to the run's environment for it."""
        log = self._logdir / f"worker-{len(self.all)}.log"
        with log.open("wb") as out:
            proc = subprocess.Popen(
                [sys.executable, "-m", "hooklane.cli", "worker"],
                env={**self._env, **env},
                cwd=REPO,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        run = WorkerRun(proc, log, time.time())
        self.all.append(run)
        return run

    def live(self) -> list[WorkerRun]:
        return [w for w in self.all if w.ended_by is None and w.proc.poll() is None]

    def signal(self, worker: WorkerRun, sig: signal.Signals) -> None:
        worker.ended_by = sig.name
        worker.signalled_at = time.time()
        worker.proc.send_signal(sig)

    def poll(self) -> None:
        """Note exits; an exit nobody asked for, or a drain that did not end
        cleanly, is a failure."""
        for w in self.all:
            if w.exit_code is not None:
                continue
            code = w.proc.poll()
            if code is None:
                continue
            w.exit_code, w.exited_at = code, time.time()
            if w.ended_by is None:
                self._fail(w, "exited on its own")
            elif w.ended_by == "SIGTERM" and code != 0:
                self._fail(w, "SIGTERM drain did not exit cleanly")

    def _fail(self, w: WorkerRun, why: str) -> None:
        self.failures.append(
            WorkerFailure(w.pid, w.exit_code, round(w.exited_at - self._t0, 2), why, tail(w.log))
        )

    def sample_memory(self) -> None:
        now = time.time()
        for w in self.all:
            # Not while it is still importing: its size then says nothing.
            if w.exit_code is None and now - w.started > 3:
                with suppress(psutil.Error):
                    w.rss.append((now, psutil.Process(w.pid).memory_info().rss))

    async def stop_all_async(self, grace: float = 15.0) -> None:
        """stop_all off the event loop, which must go on serving the
        receivers that draining workers are still waiting on."""
        await asyncio.get_running_loop().run_in_executor(None, self.stop_all, grace)

    def stop_all(self, grace: float = 15.0) -> None:
        """SIGTERM (the drain) for every live worker, SIGKILL after grace."""
        for w in self.all:
            if w.proc.poll() is None:
                if w.ended_by is None:
                    w.ended_by = "stop"
                w.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for w in self.all:
            try:
                w.proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                w.proc.kill()
                w.proc.wait(10)
        self.poll()


def memory_summary(workers: Sequence[WorkerRun]) -> dict[str, Any]:
    """RSS in MiB: at start (first sample of the first workers), the peak of
    any worker, at the end (last sample of those alive at the end), and the
    growth of the longest-lived worker from its first to its last sample."""
    mib = lambda b: round(b / 2**20, 1)  # noqa: E731
    sampled = [w for w in workers if w.rss]
    if not sampled:
        return {}
    first = min(w.started for w in sampled)
    initial = [w for w in sampled if w.started - first < 5]
    at_end = [w for w in sampled if w.ended_by in (None, "stop")]
    longest = max(sampled, key=lambda w: w.rss[-1][0] - w.rss[0][0])
    return {
        "start_mib": mib(max(w.rss[0][1] for w in initial)),
        "peak_mib": mib(max(r for w in sampled for _, r in w.rss)),
        "end_mib": mib(max(w.rss[-1][1] for w in at_end)) if at_end else None,
        "longest_lived": {
            "seconds": round(longest.rss[-1][0] - longest.rss[0][0], 1),
            "start_mib": mib(longest.rss[0][1]),
            "peak_mib": mib(max(r for _, r in longest.rss)),
            "end_mib": mib(longest.rss[-1][1]),
        },
    }


async def wait_workers_ready(control: Control, workers: int, timeout: float = 30.0) -> None:
    """Until ``workers`` workers are live and every partition is owned."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        row = (
            await control.fetch(
                """
            SELECT count(*) FILTER (WHERE classid = $1::int::oid AND objsubid = 2) AS members,
                   count(*) FILTER (WHERE classid = $2::int::oid AND objsubid = 2) AS owned,
                   (SELECT partition_count FROM hooklane_config) AS partitions
            FROM pg_locks
            WHERE locktype = 'advisory' AND granted
              AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
            """,
                MEMBER_CLASS,
                PARTITION_CLASS,
            )
        )[0]
        if row["members"] >= workers and row["owned"] >= row["partitions"]:
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"{workers} worker(s) did not own every partition within {timeout} s")


async def in_flight_of(control: Control, pid: int) -> int:
    """Deliveries in flight in the partitions a worker process owns."""
    return await control.fetchval(
        """SELECT count(*) FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id
           JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid = $1::int::oid
                AND l.objid = e.partition::oid AND l.objsubid = 2 AND l.granted
           JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE d.state = 'sending' AND a.application_name = $2""",
        PARTITION_CLASS,
        f"hooklane-worker:{pid}",
    )


# --------------------------------------------------------------------------
# What was published and what arrived


class Ledger:
    """Committed events, the deliveries they owe to healthy endpoints, and
    what the receiver got. Kept up to date while the run goes, so that the
    fault loop can wait for recovery without scanning everything."""

    def __init__(self, endpoints: Sequence[Endpoint], receiver: Receiver) -> None:
        self.healthy = [ep for ep in endpoints if ep.hostile is None]
        self.hostile = [ep for ep in endpoints if ep.hostile is not None]
        self._receiver = receiver
        self._cursor = 0
        self.committed: dict[str, tuple[float, str, str]] = {}  # id -> (at, tenant, type)
        self.first: dict[tuple[str, str], float] = {}  # (path, id) -> first receipt
        self.receipts: Counter[tuple[str, str]] = Counter()
        self.pending: dict[tuple[str, str], float] = {}  # owed, not yet received -> committed at
        self.newest_received_commit = 0.0

    def expected(self, event_id: str) -> list[Endpoint]:
        _, tenant, event_type = self.committed[event_id]
        return [ep for ep in self.healthy if matches(ep, tenant, event_type)]

    def commit(self, event_id: str, tenant: str, event_type: str, at: float) -> None:
        self.committed[event_id] = (at, tenant, event_type)
        for ep in self.expected(event_id):
            key = (ep.path, event_id)
            if key in self.first:  # arrived before the commit was acknowledged to us
                self.newest_received_commit = max(self.newest_received_commit, at)
            else:
                self.pending[key] = at

    def absorb(self) -> None:
        received = self._receiver.received
        for r in received[self._cursor :]:
            key = (r.path, r.headers.get("webhook-id", ""))
            self.receipts[key] += 1
            if key in self.first:
                continue
            self.first[key] = r.at
            if self.pending.pop(key, None) is not None:
                self.newest_received_commit = max(self.newest_received_commit, self.committed[key[1]][0])
        self._cursor = len(received)

    def delivering_since(self, t: float) -> bool:
        """Something published after ``t`` has reached a receiver."""
        self.absorb()
        return self.newest_received_commit > t

    def drained_until(self, t: float) -> bool:
        """Everything published up to ``t`` has reached its receivers."""
        self.absorb()
        return not any(at <= t for at in self.pending.values())


# --------------------------------------------------------------------------
# The publisher


class Publisher:
    """Publishes at a steady rate, one event per transaction, and rides
    through lost connections: an event counts only once its commit is
    certain. When a connection dies with the outcome unknown (during COMMIT,
    say), the event is looked up by id after reconnecting, and published
    again under the same id if it is not there."""

    def __init__(
        self,
        dsn: str,
        rate: float,
        rng: random.Random,
        ledger: Ledger,
        give_up_after: float = 120.0,
        ordering_keys: int = 0,
    ) -> None:
        self._dsn = dsn
        self._rate = rate
        self._rng = rng
        self._ledger = ledger
        self._ordering_keys = ordering_keys
        self._give_up_after = give_up_after
        self._conn: asyncpg.Connection | None = None
        self._tag = uuid.uuid4().hex[:6]
        self.stats: Counter[str] = Counter()

    async def run(self, stop: asyncio.Event) -> None:
        next_at = time.monotonic()
        seq = 0
        try:
            while not stop.is_set():
                # Half the events name one of the scenario's ordering keys.
                key = None
                if self._ordering_keys and self._rng.random() < 0.5:
                    key = f"key-{self._rng.randrange(self._ordering_keys)}"
                await self._publish(
                    f"evt_{self._tag}_{seq}", self._rng.choice(TENANTS), self._rng.choice(TYPES), seq, key
                )
                seq += 1
                # A steady rate, without a burst to catch up after an outage:
                # the requests an application could not serve meanwhile are
                # not queued up somewhere.
                next_at = max(next_at + 1 / self._rate, time.monotonic() - 1 / self._rate)
                await _sleep_unless(stop, next_at - time.monotonic())
        finally:
            await self._drop()

    async def _publish(
        self, event_id: str, tenant: str, event_type: str, seq: int, ordering_key: str | None = None
    ) -> None:
        deadline = time.monotonic() + self._give_up_after
        delay = 0.05
        while True:
            try:
                conn = await self._connection()
                async with conn.transaction():
                    if ordering_key is None:
                        await hooklane.publish(
                            conn, tenant=tenant, type=event_type, data={"seq": seq}, id=event_id
                        )
                    else:
                        # The SQL contract (docs/publishing.md), as any
                        # language's publisher calls it.
                        await conn.fetchval(
                            "SELECT hooklane_publish_v3($1, $2, $3::text::jsonb, $4, NULL, NULL, $5)",
                            tenant,
                            event_type,
                            json.dumps({"seq": seq}),
                            event_id,
                            ordering_key,
                        )
                self._ledger.commit(event_id, tenant, event_type, time.time())
                self.stats["committed"] += 1
                return
            except LOST:
                self.stats["failed_attempts"] += 1
                await self._drop()
            if await self._stored(event_id, deadline):
                self.stats["committed"] += 1
                self.stats["unknown_outcome_committed"] += 1
                self._ledger.commit(event_id, tenant, event_type, time.time())
                return
            if time.monotonic() > deadline:
                self.stats["abandoned"] += 1
                return
            self.stats["retried"] += 1
            await asyncio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _stored(self, event_id: str, deadline: float) -> bool:
        """Whether an event whose outcome we missed is in the table."""
        while time.monotonic() < deadline:
            try:
                conn = await self._connection()
                return bool(
                    await conn.fetchval("SELECT EXISTS (SELECT 1 FROM events WHERE id = $1)", event_id)
                )
            except LOST:
                await self._drop()
                await asyncio.sleep(0.2)
        return False

    async def _connection(self) -> asyncpg.Connection:
        if self._conn is None or self._conn.is_closed():
            self._conn = await asyncpg.connect(
                self._dsn,
                timeout=5,
                command_timeout=10,
                server_settings={"application_name": "chaos-publisher"},
            )
        return self._conn

    async def _drop(self) -> None:
        if self._conn is not None:
            self._conn.terminate()
        self._conn = None


async def _sleep_unless(stop: asyncio.Event, seconds: float) -> None:
    if seconds <= 0:
        return
    with suppress(TimeoutError):
        await asyncio.wait_for(stop.wait(), timeout=seconds)


# --------------------------------------------------------------------------
# Scenarios


@dataclass(frozen=True)
class Scenario:
    """One run: ``faults`` injected in order (each after a random gap, and
    after the system recovered from the one before), while publishing at
    ``rate`` for at least ``duration`` seconds."""

    name: str
    faults: tuple[str, ...]
    workers: int = 2
    rate: float = 20.0
    duration: float = 20.0
    gap: tuple[float, float] = (0.5, 2.0)
    warmup: float = 2.0
    recover_timeout: float = 30.0
    drain_timeout: float = 60.0
    endpoints: tuple[Endpoint, ...] = HEALTHY
    # HostileServer modes, each an endpoint of its own in every tenant.
    hostile_modes: tuple[str, ...] = ()
    seed: int | None = None
    worker_env: tuple[tuple[str, str], ...] = ()
    # Half the events name one of this many ordering keys (0: none), and
    # the run checks their order at the receiver.
    ordering_keys: int = 0


@dataclass
class Fault:
    kind: str
    start: float
    end: float
    detail: dict[str, Any] = field(default_factory=dict)
    recover_s: float | None = None  # fault end -> first receipt of an event published after it
    drain_s: float | None = None  # fault end -> everything published before its end received
    # fault end -> no delivery reserved before it still in flight in the
    # database: what a dead worker held was rescued (lease) and finished
    settled_s: float | None = None


@dataclass
class Report:
    scenario: str
    seed: int
    config: dict[str, Any]
    seconds: float = 0.0
    events: int = 0
    deliveries_owed: int = 0
    received: int = 0
    dead: int = 0
    lost: int = 0
    lost_samples: list[dict[str, Any]] = field(default_factory=list)
    duplicates: int = 0
    duplicated_deliveries: int = 0
    unexpected_receipts: int = 0
    peaks: dict[str, dict[str, int]] = field(default_factory=dict)
    limit_exceeded: list[str] = field(default_factory=list)
    faults: list[dict[str, Any]] = field(default_factory=list)
    recovery: dict[str, Any] = field(default_factory=dict)
    latency_ms: dict[str, float] = field(default_factory=dict)
    publisher: dict[str, int] = field(default_factory=dict)
    workers: dict[str, Any] = field(default_factory=dict)
    worker_failures: list[dict[str, Any]] = field(default_factory=list)
    memory: dict[str, Any] = field(default_factory=dict)
    hostile: dict[str, Any] = field(default_factory=dict)
    # Ordered events: how many keys and numbers, and what broke their order.
    ordered: dict[str, Any] = field(default_factory=dict)
    order_broken: list[str] = field(default_factory=list)
    order_missing: list[str] = field(default_factory=list)
    key_overlaps: list[str] = field(default_factory=list)
    drained: bool = False
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ok": self.ok}


class _Run:
    """The moving parts of one scenario run."""

    def __init__(
        self,
        scenario: Scenario,
        pg: LocalPostgres,
        dsn: str,
        receiver: Receiver,
        endpoints: Sequence[Endpoint],
        hostile: Any,
        logdir: Path,
    ) -> None:
        self.scenario = scenario
        self.pg = pg
        self.dsn = dsn
        self.seed = scenario.seed if scenario.seed is not None else random.randrange(2**31)
        self.rng = random.Random(self.seed)
        self.t0 = time.time()
        self.control = Control(dsn)
        self.endpoints = list(endpoints)
        self.ledger = Ledger(endpoints, receiver)
        self.receiver = receiver
        self.hostile = hostile  # the HostileServer, if the scenario has hostile endpoints
        self.drained = False
        self.workers = Workers(dsn, logdir, self.t0, dict(scenario.worker_env))
        self.publisher = Publisher(
            dsn, scenario.rate, self.rng, self.ledger, ordering_keys=scenario.ordering_keys
        )
        self.faults: list[Fault] = []
        self.problems: list[str] = []
        self.terminated: Counter[str] = Counter()

    def at(self, t: float) -> float:
        return round(t - self.t0, 2)


async def run_scenario(scenario: Scenario, pg: LocalPostgres, logdir: Path | None = None) -> Report:
    """Run one scenario on a database of its own on ``pg`` (dropped after)."""
    own_logdir = logdir is None
    logdir = logdir or Path(tempfile.mkdtemp(prefix="hooklane-chaos-"))
    dsn = await create_database(pg.dsn, f"chaos_{scenario.name}", durable=True)
    try:
        async with AsyncExitStack() as stack:
            receiver = await stack.enter_async_context(Receiver())
            urls, endpoints, hostile = await _receivers(stack, scenario, receiver)
            conn = await asyncpg.connect(dsn)
            try:
                await create_endpoints(conn, endpoints, urls)
            finally:
                await conn.close()
            run = _Run(scenario, pg, dsn, receiver, endpoints, hostile, logdir)
            try:
                await _drive(run)
            finally:
                await run.workers.stop_all_async()
                await run.control.close()
            return await _report(run)
    finally:
        await drop_database(pg.dsn, dsn)
        if own_logdir:
            shutil.rmtree(logdir, ignore_errors=True)


async def _receivers(
    stack: AsyncExitStack, scenario: Scenario, receiver: Receiver
) -> tuple[dict[str, str], list[Endpoint], Any]:
    """Endpoint URLs: the healthy receiver's paths, and a HostileServer (from
    testsupport/hostile.py) for hostile modes, one endpoint per mode and tenant."""
    endpoints = list(scenario.endpoints)
    urls = {ep.name: receiver.on(ep.name, Answer(204, delay=ep.delay)) for ep in endpoints}
    if not scenario.hostile_modes:
        return urls, endpoints, None
    from testsupport.hostile import (
        HostileServer,  # written alongside; only this scenario needs it
    )

    hostile = await stack.enter_async_context(HostileServer())
    for i, mode in enumerate(scenario.hostile_modes):
        ep = hostile_endpoint(mode, TENANTS[i % len(TENANTS)])
        endpoints.append(ep)
        urls[ep.name] = hostile.url(mode)
    return urls, endpoints, hostile


async def _drive(run: _Run) -> None:
    s = run.scenario
    for _ in range(s.workers):
        run.workers.start()
    await wait_workers_ready(run.control, s.workers)
    stop_publishing, stop_monitor = asyncio.Event(), asyncio.Event()
    publisher = asyncio.create_task(run.publisher.run(stop_publishing), name="publisher")
    monitor = asyncio.create_task(_monitor(run, stop_monitor), name="monitor")
    try:
        started = time.monotonic()
        await asyncio.sleep(s.warmup)
        await _inject_all(run, publisher)
        # Publish on for the rest of the duration, and a little after the
        # last fault in any case, so recovery is seen under load.
        await asyncio.sleep(max(1.0, s.duration - (time.monotonic() - started)))
        stop_publishing.set()
        await publisher
        run.drained = await _final_drain(run)
    finally:
        stop_publishing.set()
        stop_monitor.set()
        for task in (publisher, monitor):
            if not task.done():
                task.cancel()
        await asyncio.gather(publisher, monitor, return_exceptions=True)
        if publisher.done() and not publisher.cancelled() and publisher.exception():
            raise publisher.exception()


async def _monitor(run: _Run, stop: asyncio.Event) -> None:
    """Worker liveness every quarter second, memory every second."""
    tick = 0
    while not stop.is_set():
        run.workers.poll()
        if tick % 4 == 0:
            run.workers.sample_memory()
        tick += 1
        await _sleep_unless(stop, 0.25)


async def _inject_all(run: _Run, publisher: asyncio.Task) -> None:
    for n, kind in enumerate(run.scenario.faults):
        if run.workers.failures or publisher.done():
            run.problems.append(
                f"faults stopped after {n} of {len(run.scenario.faults)}: a worker died or the publisher stopped"
            )
            return
        await asyncio.sleep(run.rng.uniform(*run.scenario.gap))
        start = time.time()
        detail = await INJECT[kind](run)
        fault = Fault(kind, start, time.time(), detail)
        run.faults.append(fault)
        await _await_recovery(run, fault, n)


async def _await_recovery(run: _Run, fault: Fault, n: int) -> None:
    """Before the next fault: deliveries flowing again, the backlog of
    everything published up to the fault's end delivered, what was in flight
    at the fault finished, and the replacement of a killed worker joined (a
    rolling update waits for readiness too; without that, faults in quick
    succession leave no worker at all). Only the settling is timed here,
    so it comes before the wait for the replacement; the rest is computed
    from the receipts afterwards."""
    s = run.scenario
    deadline = time.monotonic() + s.recover_timeout
    while not run.ledger.delivering_since(fault.end):
        if time.monotonic() > deadline or _all_workers_gone(run):
            run.problems.append(
                f"fault {n + 1} ({fault.kind}): nothing delivered within {s.recover_timeout:g} s after it"
            )
            return
        await asyncio.sleep(0.05)
    while not run.ledger.drained_until(fault.end):
        if time.monotonic() > deadline or _all_workers_gone(run):
            late = await _late_samples(run, fault.end)
            run.problems.append(
                f"fault {n + 1} ({fault.kind}): backlog not drained within {s.recover_timeout:g} s; "
                f"waiting: {late}"
            )
            return
        await asyncio.sleep(0.05)
    while await _in_flight_since(run.control, fault.end):
        if time.monotonic() > deadline or _all_workers_gone(run):
            run.problems.append(
                f"fault {n + 1} ({fault.kind}): deliveries in flight at the fault not finished within {s.recover_timeout:g} s"
            )
            return
        await asyncio.sleep(0.1)
    fault.settled_s = round(time.time() - fault.end, 3)
    if "replacement" in fault.detail:
        if not await _joined(run, fault.detail["replacement"], deadline):
            run.problems.append(
                f"fault {n + 1} ({fault.kind}): the replacement worker did not join within {s.recover_timeout:g} s"
            )
            return
        fault.detail["replaced_s"] = round(time.time() - fault.end, 3)


async def _in_flight_since(control: Control, t: float) -> int:
    return await control.fetchval(
        "SELECT count(*) FROM deliveries WHERE state = 'sending' AND reserved_at <= to_timestamp($1)", t
    )


async def _joined(run: _Run, pid: int, deadline: float) -> bool:
    """Until the worker holds its lock connection and every partition is
    owned again (the victim's, released at its exit, taken by the others)."""
    while time.monotonic() < deadline and not _all_workers_gone(run):
        row = (
            await run.control.fetch(
                """SELECT EXISTS (SELECT 1 FROM pg_stat_activity WHERE application_name = $1) AS joined,
                      (SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
                         AND classid = $2::int::oid AND objsubid = 2
                         AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))
                      >= (SELECT partition_count FROM hooklane_config) AS covered""",
                f"hooklane-worker:{pid}",
                PARTITION_CLASS,
            )
        )[0]
        if row["joined"] and row["covered"]:
            return True
        await asyncio.sleep(0.05)
    return False


def _all_workers_gone(run: _Run) -> bool:
    run.workers.poll()
    return not run.workers.live()


# --------------------------------------------------------------------------
# Faults


async def _victim(run: _Run) -> WorkerRun:
    """A random worker among those that joined (hold their lock connection):
    a replacement still importing has no SIGTERM handler yet and would just
    die of the signal, with nothing in flight to test."""
    deadline = time.monotonic() + 20
    while True:
        joined = {
            int(name.split(":")[1])
            for name in [
                r["application_name"]
                for r in await run.control.fetch(
                    "SELECT application_name FROM pg_stat_activity WHERE application_name LIKE 'hooklane-worker:%'"
                )
            ]
        }
        candidates = [w for w in run.workers.live() if w.pid in joined]
        if candidates or time.monotonic() > deadline:
            return run.rng.choice(candidates or run.workers.live())
        await asyncio.sleep(0.05)


async def _kill(run: _Run) -> dict[str, Any]:
    """SIGKILL a random worker while it is delivering, and start a
    replacement as a Deployment would."""
    victim = await _victim(run)
    deadline = time.monotonic() + 5
    in_flight = 0
    while time.monotonic() < deadline:
        in_flight = await in_flight_of(run.control, victim.pid)
        if in_flight:
            break
        await asyncio.sleep(0.02)
    run.workers.signal(victim, signal.SIGKILL)
    replacement = run.workers.start()
    return {"pid": victim.pid, "in_flight": in_flight, "replacement": replacement.pid}


async def _term(run: _Run) -> dict[str, Any]:
    """SIGTERM a random worker (it drains and exits 0) and start a
    replacement at once, as a rolling update does."""
    victim = await _victim(run)
    in_flight = await in_flight_of(run.control, victim.pid)
    run.workers.signal(victim, signal.SIGTERM)
    replacement = run.workers.start()
    return {"pid": victim.pid, "in_flight": in_flight, "replacement": replacement.pid}


def _restart(mode: str) -> Callable[[_Run], Awaitable[dict[str, Any]]]:
    async def restart(run: _Run) -> dict[str, Any]:
        started = time.monotonic()
        await asyncio.get_running_loop().run_in_executor(None, restart_postgres, run.pg, mode)
        return {"restart_s": round(time.monotonic() - started, 2)}

    restart.__name__ = f"restart_{mode}"
    return restart


async def _terminate(run: _Run) -> dict[str, Any]:
    """pg_terminate_backend on a random subset of the database's client
    backends (the workers' and the publisher's), as an administrator or a
    connection pooler's failover does."""
    backends = await run.control.fetch(
        """SELECT pid, application_name FROM pg_stat_activity
           WHERE datname = current_database() AND backend_type = 'client backend'
             AND pid <> pg_backend_pid()"""
    )
    if not backends:
        return {"terminated": []}
    chosen = run.rng.sample(backends, run.rng.randint(1, len(backends)))
    pids = [r["pid"] for r in chosen]
    await run.control.fetchval("SELECT count(pg_terminate_backend(p)) FROM unnest($1::int[]) p", pids)
    names = sorted(_role(r["application_name"]) for r in chosen)
    run.terminated.update(names)
    return {"terminated": names, "of": len(backends)}


def _role(application_name: str) -> str:
    if application_name.startswith("hooklane-worker:"):
        return "worker-lock"
    return application_name or "worker-pool"


INJECT: dict[str, Callable[[_Run], Awaitable[dict[str, Any]]]] = {
    "kill": _kill,
    "term": _term,
    "pg-fast": _restart("fast"),
    "pg-immediate": _restart("immediate"),
    "terminate": _terminate,
}


# --------------------------------------------------------------------------
# The end of a run: drain, then the invariants


async def _final_drain(run: _Run) -> bool:
    """Wait until every delivery owed is received or finished in the
    database (hostile ones: dead or delivered), bounded. Whether it got
    there."""
    deadline = time.monotonic() + run.scenario.drain_timeout
    while time.monotonic() < deadline and not _all_workers_gone(run):
        run.ledger.absorb()
        # The database is asked only once the backlog is small: until then
        # the receiver's count says enough.
        healthy_done = not run.ledger.pending or (
            len(run.ledger.pending) < 1000 and not await _undecided(run)
        )
        if healthy_done and await _hostile_settled(run):
            return True
        await asyncio.sleep(0.25)
    return False


async def _undecided(run: _Run) -> list[tuple[str, str]]:
    """Owed deliveries not received and not dead either."""
    states = await _states(run.control, list(run.ledger.pending))
    return [k for k in run.ledger.pending if not _dead_with_reason(states.get(k))]


async def _hostile_settled(run: _Run) -> bool:
    names = [ep.name for ep in run.ledger.hostile]
    if not names:
        return True
    # A retry the receiver put off (Retry-After, honoured up to 6 h) is an
    # end for this run: its attempt is recorded and it is not due soon.
    return not await run.control.fetchval(
        """SELECT count(*) FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
           WHERE ep.namespace = $1 AND ep.name = ANY($2::text[]) AND ep.state = 'active'
             AND (d.state = 'sending'
                  OR (d.state = 'pending'
                      AND (d.attempts = 0 OR d.next_attempt_at < now() + interval '10 seconds')))""",
        NAMESPACE,
        names,
    )


async def _states(control: Control, keys: list[tuple[str, str]]) -> dict[tuple[str, str], asyncpg.Record]:
    if not keys:
        return {}
    rows = await control.fetch(
        """SELECT '/' || ep.name AS path, d.event_id, d.state, d.attempts, d.last_error, d.last_status
           FROM unnest($1::text[], $2::text[]) AS k(name, event_id)
           JOIN endpoints ep ON ep.namespace = $3 AND ep.name = k.name
           JOIN deliveries d ON d.endpoint_id = ep.id AND d.event_id = k.event_id""",
        [p.lstrip("/") for p, _ in keys],
        [e for _, e in keys],
        NAMESPACE,
    )
    return {(r["path"], r["event_id"]): r for r in rows}


def _dead_with_reason(row: asyncpg.Record | None) -> bool:
    return row is not None and row["state"] == "dead" and bool(row["last_error"])


async def _report(run: _Run) -> Report:
    s = run.scenario
    r = Report(s.name, run.seed, _config(s))
    r.seconds = round(time.time() - run.t0, 1)
    r.events = len(run.ledger.committed)
    r.publisher = dict(run.publisher.stats)
    r.drained = run.drained
    run.ledger.absorb()
    await _account_healthy(run, r)
    await _account_hostile(run, r)
    await _account_ordered(run, r)
    _limits(run, r)
    _recovery(run, r)
    _workers(run, r)
    r.problems = run.problems + _problems(r)
    return r


def _config(s: Scenario) -> dict[str, Any]:
    c = asdict(s)
    c["faults"] = dict(Counter(s.faults))
    c["endpoints"] = [ep.name for ep in s.endpoints]
    return c


async def _account_healthy(run: _Run, r: Report) -> None:
    ledger = run.ledger
    owed = [(ep.path, eid) for eid in ledger.committed for ep in ledger.expected(eid)]
    r.deliveries_owed = len(owed)
    missing = [k for k in owed if k not in ledger.first]
    r.received = len(owed) - len(missing)
    states = await _states(run.control, missing)
    dead = [k for k in missing if _dead_with_reason(states.get(k))]
    lost = [k for k in missing if not _dead_with_reason(states.get(k))]
    r.dead, r.lost = len(dead), len(lost)
    r.lost_samples = [_lost_sample(run, k, states.get(k)) for k in lost[:20]]
    owed_set = set(owed)
    extra = [n - 1 for k, n in ledger.receipts.items() if n > 1 and k in owed_set]
    r.duplicates, r.duplicated_deliveries = sum(extra), len(extra)
    healthy_paths = {ep.path for ep in ledger.healthy}
    r.unexpected_receipts = sum(
        n for k, n in ledger.receipts.items() if k not in owed_set and k[0] in healthy_paths
    )
    latencies = sorted(
        max(0.0, ledger.first[k] - ledger.committed[k[1]][0]) for k in owed if k in ledger.first
    )
    r.latency_ms = _percentiles([x * 1000 for x in latencies])


async def _late_samples(run: _Run, t: float, most: int = 5) -> list[dict[str, Any]]:
    """A few of the deliveries published up to ``t`` and not yet received,
    each with its row and its recorded attempts: where it waits."""
    keys = [k for k, at in run.ledger.pending.items() if at <= t][:most]
    states = await _states(run.control, keys)
    samples = []
    for key in keys:
        sample = _lost_sample(run, key, states.get(key))
        rows = await run.control.fetch(
            """SELECT d.id, d.next_attempt_at::text, d.reserved_at::text, d.lease_expires_at::text,
                      d.attempted_by, ep.partition, ep.paused_until::text,
                      (SELECT json_agg(json_build_object(
                                  'attempt', a.attempt, 'by', a.attempted_by, 'started', a.started_at,
                                  'seconds', a.duration_seconds, 'outcome', a.outcome,
                                  'status', a.status, 'failure', a.failure)
                              ORDER BY a.recorded_at)::text
                       FROM delivery_attempts a WHERE a.delivery_id = d.id) AS attempts
               FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
               WHERE ep.namespace = $1 AND ep.name = $2 AND d.event_id = $3""",
            NAMESPACE,
            key[0].lstrip("/"),
            key[1],
        )
        sample.update(dict(rows[0]) if rows else {})
        samples.append(sample)
    return samples


def _lost_sample(run: _Run, key: tuple[str, str], row: asyncpg.Record | None) -> dict[str, Any]:
    at, _tenant, event_type = run.ledger.committed[key[1]]
    sample = {"endpoint": key[0], "event": key[1], "committed_at_s": run.at(at), "type": event_type}
    if row is None:
        sample["delivery"] = "no row"
    else:
        sample.update(state=row["state"], attempts=row["attempts"], last_error=row["last_error"])
    return sample


async def _account_hostile(run: _Run, r: Report) -> None:
    """Hostile endpoints' deliveries must end as recorded attempts: dead with
    a reason, delivered, or (on an endpoint the receiver had deactivated,
    which keeps its deliveries) held with the endpoint's reason."""
    ledger = run.ledger
    if not ledger.hostile:
        return
    rows = await run.control.fetch(
        """SELECT ep.name, ep.state AS endpoint_state, ep.deactivated_at, ep.deactivated_reason,
                  d.event_id, d.state, d.attempts, d.last_error, d.last_status
           FROM endpoints ep LEFT JOIN deliveries d ON d.endpoint_id = ep.id
           WHERE ep.namespace = $1 AND ep.name = ANY($2::text[])""",
        NAMESPACE,
        [ep.name for ep in ledger.hostile],
    )
    by_key = {(row["name"], row["event_id"]): row for row in rows if row["event_id"]}
    endpoint_rows = {row["name"]: row for row in rows}
    per_endpoint: dict[str, Counter[str]] = {}
    lost: list[dict[str, Any]] = []
    for ep in ledger.hostile:
        tally: Counter[str] = Counter()
        for eid, (at, tenant, event_type) in ledger.committed.items():
            if not matches(ep, tenant, event_type):
                continue
            outcome = _hostile_outcome(by_key.get((ep.name, eid)), endpoint_rows.get(ep.name), at)
            tally[outcome] += 1
            if outcome == "lost" and len(lost) < 20:
                lost.append({"endpoint": ep.name, "event": eid, "committed_at_s": run.at(at)})
        per_endpoint[ep.name] = tally
    hits = getattr(run.hostile, "hits", None)
    total: Counter[str] = sum(per_endpoint.values(), Counter())
    r.hostile = {
        "outcomes": dict(total),
        "per_endpoint": {k: dict(v) for k, v in per_endpoint.items()},
        "server_hits": dict(hits) if hits is not None else None,
        "endpoint_states": {n: row["endpoint_state"] for n, row in endpoint_rows.items()},
    }
    r.lost += total["lost"]
    r.lost_samples += lost


async def _account_ordered(run: _Run, r: Report) -> None:
    """Per healthy endpoint and key: the numbers received in order, each
    number the key was given received (or dead with a reason), and one call
    of a key at a time at the receiver."""
    if not run.scenario.ordering_keys:
        return
    healthy = {ep.path for ep in run.ledger.healthy}
    received = {
        path: numbers_by_key(x for x in run.receiver.received if x.path == path) for path in sorted(healthy)
    }
    r.order_broken = [f"{path} {broken}" for path, got in received.items() for broken in order_broken(got)]
    given = await run.control.fetch(
        """SELECT '/' || ep.name AS path, k.key, k.last_seq,
                  coalesce((SELECT array_agg(d.ordering_seq) FROM deliveries d
                            WHERE d.endpoint_id = ep.id AND d.ordering_key = k.key AND d.state = 'dead'
                              AND d.last_error IS NOT NULL), '{}') AS dead
           FROM ordering_keys k JOIN endpoints ep ON ep.id = k.endpoint_id
           WHERE ep.namespace = $1""",
        NAMESPACE,
    )
    for row in given:
        if row["path"] not in healthy:
            continue
        got = set(received[row["path"]].get(row["key"], []))
        missing = sorted(set(range(1, row["last_seq"] + 1)) - got - set(row["dead"]))
        if missing:
            r.order_missing.append(f"{row['path']} {row['key']}: {missing[:10]} of 1..{row['last_seq']}")
    r.key_overlaps = [
        f"{path} {key}: {peak} calls in flight at once"
        for (path, key), peak in run.receiver.key_peak.items()
        if key and path in healthy and peak > 1
    ]
    repeats = sum(
        before == after
        for got in received.values()
        for seqs in got.values()
        for before, after in pairwise(seqs)
    )
    r.ordered = {
        "keys": sum(row["path"] in healthy for row in given),
        "numbers": sum(row["last_seq"] for row in given if row["path"] in healthy),
        "received": sum(len(s) for got in received.values() for s in got.values()),
        "repeats": repeats,
        "dead": sum(len(row["dead"]) for row in given if row["path"] in healthy),
    }


def _hostile_outcome(row: asyncpg.Record | None, endpoint: asyncpg.Record | None, committed_at: float) -> str:
    if row is None:
        # Publish does not route to a deactivated endpoint: an event
        # committed after the deactivation owes it nothing.
        deactivated = endpoint is not None and endpoint["deactivated_at"] is not None
        if deactivated and endpoint["deactivated_at"].timestamp() <= committed_at + 1.0:
            return "not routed (endpoint deactivated)"
        return "lost"
    if row["state"] == "dead":
        return "dead" if row["last_error"] else "lost"
    if row["state"] == "delivered":
        return "delivered"
    if row["endpoint_state"] == "deactivated" and row["deactivated_reason"]:
        return "held (endpoint deactivated)"
    if row["state"] == "pending" and row["attempts"] > 0 and (row["last_error"] or row["last_status"]):
        return "retrying (attempt recorded)"
    return "lost"


def _limits(run: _Run, r: Report) -> None:
    """Peaks at the healthy receiver. A hostile receiver cannot tell when
    the client gave up (a trickling answer notices only at its next write),
    so its own count would overlap a call with the next one: hostile
    endpoints' limits are not measured here."""
    for ep in run.ledger.healthy:
        peak = run.receiver.peak.get(ep.path, 0)
        r.peaks[ep.name] = {"peak": peak, "limit": ep.max_concurrency}
        if peak > ep.max_concurrency:
            r.limit_exceeded.append(f"{ep.name}: {peak} in flight, limit {ep.max_concurrency}")


def _recovery(run: _Run, r: Report) -> None:
    """Per fault, from the receipts: time from the fault's end to the first
    receipt of an event published after it, and to the moment everything
    published before it had arrived."""
    ledger = run.ledger
    done = sorted(
        (ledger.committed[eid][0], at) for (path, eid), at in ledger.first.items() if eid in ledger.committed
    )
    commits = [c for c, _ in done]
    suffix_min = _running(reversed([a for _, a in done]), min)[::-1]
    prefix_max = _running([a for _, a in done], max)
    for f in run.faults:
        i = bisect_right(commits, f.end)
        if i < len(done):
            f.recover_s = round(suffix_min[i] - f.end, 3)
        j = bisect_left(commits, f.end + 1e-9)
        if j:
            f.drain_s = round(max(0.0, prefix_max[j - 1] - f.end), 3)
        r.faults.append(
            {
                "kind": f.kind,
                "at_s": run.at(f.start),
                "took_s": round(f.end - f.start, 2),
                "recover_s": f.recover_s,
                "drain_s": f.drain_s,
                "settled_s": f.settled_s,
                **f.detail,
            }
        )
    for kind in sorted({f.kind for f in run.faults}):
        of = [f for f in run.faults if f.kind == kind]
        r.recovery[kind] = {
            "faults": len(of),
            "recover_s": _percentiles([f.recover_s for f in of if f.recover_s is not None]),
            "drain_s": _percentiles([f.drain_s for f in of if f.drain_s is not None]),
            "settled_s": _percentiles([f.settled_s for f in of if f.settled_s is not None]),
            "took_s": _percentiles([f.end - f.start for f in of]),
        }
    if run.terminated:
        r.recovery["terminated_backends"] = dict(run.terminated)


def _running(values: Iterable[float], fn: Callable[[float, float], float]) -> list[float]:
    out: list[float] = []
    for v in values:
        out.append(v if not out else fn(out[-1], v))
    return out


def _workers(run: _Run, r: Report) -> None:
    all_ = run.workers.all
    drains = [w.exited_at - w.signalled_at for w in all_ if w.ended_by == "SIGTERM" and w.exited_at]
    r.workers = {
        "started": len(all_),
        "sigkilled": sum(w.ended_by == "SIGKILL" for w in all_),
        "sigtermed": sum(w.ended_by == "SIGTERM" for w in all_),
        "sigterm_exit_codes": [w.exit_code for w in all_ if w.ended_by == "SIGTERM"],
        "sigterm_drain_s": _percentiles(drains),
        "died_on_their_own": len(run.workers.failures),
    }
    r.worker_failures = [asdict(f) for f in run.workers.failures]
    r.memory = memory_summary(all_)


def _problems(r: Report) -> list[str]:
    problems = []
    if r.lost:
        problems.append(f"{r.lost} deliveries lost (neither received nor dead with a reason)")
    problems += [f"limit exceeded: {x}" for x in r.limit_exceeded]
    for f in r.worker_failures:
        problems.append(f"worker {f['pid']} {f['why']} (exit code {f['exit_code']}) at {f['at_s']} s")
    if r.unexpected_receipts:
        problems.append(f"{r.unexpected_receipts} receipts of events never counted as committed")
    if not r.drained:
        problems.append("the backlog did not drain within the drain timeout")
    if r.events == 0:
        problems.append("nothing was published")
    if r.publisher.get("abandoned"):
        problems.append(
            f"{r.publisher['abandoned']} events could not be published within the publisher's patience"
        )
    problems += [f"order broken: {x}" for x in r.order_broken[:10]]
    problems += [f"numbers never received: {x}" for x in r.order_missing[:10]]
    problems += [f"a key's calls overlapped: {x}" for x in r.key_overlaps[:10]]
    if r.hostile and r.dead:
        problems.append(f"{r.dead} deliveries to healthy endpoints died next to hostile ones")
    return problems


def _percentiles(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    pick = lambda q: ordered[min(len(ordered) - 1, int(q * len(ordered)))]  # noqa: E731
    return {
        "n": len(ordered),
        "p50": round(pick(0.5), 3),
        "p99": round(pick(0.99), 3),
        "max": round(ordered[-1], 3),
    }


def format_report(r: Report) -> str:
    """A few lines for a human (and for an assertion message)."""
    lines = [
        f"{r.scenario}: {'ok' if r.ok else 'FAILED'} in {r.seconds} s (seed {r.seed})",
        f"  events {r.events}, deliveries owed {r.deliveries_owed}, received {r.received}, dead {r.dead}, "
        f"lost {r.lost}, duplicates {r.duplicates}",
        "  peaks " + ", ".join(f"{k} {v['peak']}/{v['limit']}" for k, v in r.peaks.items()),
        f"  publisher {r.publisher}",
        f"  workers {r.workers}; memory {r.memory}",
    ]
    for kind, rec in r.recovery.items():
        lines.append(f"  recovery {kind}: {rec}")
    if r.hostile:
        lines.append(f"  hostile {r.hostile['outcomes']}; hits {r.hostile['server_hits']}")
    if r.ordered:
        lines.append(f"  ordered {r.ordered}")
    for p in r.problems:
        lines.append(f"  PROBLEM: {p}")
    for s in r.lost_samples[:5]:
        lines.append(f"  lost: {s}")
    for f in r.worker_failures[:3]:
        lines.append(f"  worker {f['pid']} stderr tail:\n{f['stderr_tail']}")
    return "\n".join(lines)

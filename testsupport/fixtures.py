"""The fixtures and helpers tests share: a real PostgreSQL (one server per
session, a fresh database per test cloned from a migrated template by
pytest-postgresql), real HTTP receivers on loopback, and workers
in-process or as real processes."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import IO

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestClient, TestServer
from pytest_postgresql import factories

import hooklane
from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.auth import token_sources
from hooklane.delivery import RequestTerms
from hooklane.dev.postgres import LocalPostgres
from hooklane.guard import parse_networks
from hooklane.policies import RetryPolicy
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec
from hooklane.tokens import Tokens
from hooklane.worker.ready import ReadyList, Wakeup, parse_wakeup
from hooklane.worker.runner import Worker
from testsupport import recording, timings
from testsupport.receivers import Answer, Receiver


def pytest_configure(config: pytest.Config) -> None:
    if os.environ.get(recording.ENV):
        recording.install(os.environ[recording.ENV])


SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# Every receiver a test starts listens on loopback, which the destination
# guard refuses unless allowed: each worker a test starts allows it, explicitly.
LOOPBACK = "127.0.0.0/8,::1/128"


@dataclass(frozen=True)
class Server:
    """What pytest-postgresql's ``depends_on`` reads from a base executor."""

    host: str
    port: int
    user: str = "postgres"
    password: str = ""
    options: str = ""
    maintenance_dbname: str = "postgres"
    template_dbname: str | None = None


@pytest.fixture(scope="session")
def local_postgres() -> Iterator[LocalPostgres]:
    with LocalPostgres() as pg:
        yield pg


@pytest.fixture(scope="session")
def pg_server(local_postgres: LocalPostgres) -> Server:
    return Server(host="127.0.0.1", port=local_postgres.port)


@pytest.fixture
def database_outage(local_postgres: LocalPostgres) -> Callable[[], AbstractContextManager[None]]:
    """``with database_outage():`` stops the tests' Postgres for the block:
    every connection (the test's own ``db`` too) is dropped, new ones are
    refused. It starts again when the block ends, even when the block fails,
    since the next tests share it."""

    @contextmanager
    def outage() -> Iterator[None]:
        local_postgres.pause()
        try:
            yield
        finally:
            local_postgres.resume()

    return outage


def server_processes(local_postgres: LocalPostgres) -> list[int]:
    """The pids of the tests' PostgreSQL: the postmaster (first) and every
    process it started (backends, checkpointer, WAL writer...)."""
    postmaster = int((local_postgres.datadir / "postmaster.pid").read_text().split()[0])
    children = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
                ppid = int(stat.read().rpartition(")")[2].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == postmaster:
            children.append(int(entry))
    return [postmaster, *children]


@pytest.fixture
def database_stall(local_postgres: LocalPostgres) -> Callable[[], AbstractContextManager[None]]:
    """``with database_stall():`` stops every process of the tests' Postgres
    (SIGSTOP) for the block: connections stay open and new ones are taken
    by the kernel, but nothing answers, as with a server frozen by its
    disk, a VM pause or a network partition that drops no packet. They run
    again (SIGCONT) when the block ends, even when it fails, since the next
    tests share the server."""

    @contextmanager
    def stall() -> Iterator[None]:
        stopped: list[int] = []
        try:
            # The postmaster first, so that it starts no process once its
            # children are listed.
            postmaster = server_processes(local_postgres)[0]
            os.kill(postmaster, signal.SIGSTOP)
            stopped.append(postmaster)
            for pid in server_processes(local_postgres)[1:]:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
                    stopped.append(pid)
            yield
        finally:
            for pid in stopped:
                with suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

    return stall


def _migrate_template(
    host: str, port: int, user: str, dbname: str, password: str | None = None, **_: object
) -> None:
    async def run() -> None:
        conn = await asyncpg.connect(
            host=host, port=port, user=user, database=dbname, password=password or None
        )
        try:
            await store.migrate(conn)
        finally:
            await conn.close()

    asyncio.run(run())


postgresql_noproc = factories.postgresql_noproc(
    depends_on="pg_server", dbname="hooklane", load=[_migrate_template]
)
postgresql = factories.postgresql("postgresql_noproc")


@pytest.fixture
def dsn(postgresql) -> str:
    info = postgresql.info
    return f"postgresql://{info.user}@{info.host}:{info.port}/{info.dbname}"


@pytest.fixture
def db_sync(postgresql):
    """Run a query on the test database from synchronous tests; rows as tuples."""

    def query(sql: str, *params: object) -> list[tuple]:
        with postgresql.cursor() as cur:
            cur.execute(sql, params or None)
            rows = [tuple(r) for r in cur.fetchall()]
        postgresql.rollback()
        return rows

    return query


@pytest.fixture
async def db(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A connection as the CLI opens one: its errors are Hooklane's."""
    conn = await store.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def fresh_dsn(pg_server: Server) -> AsyncIterator[str]:
    """An empty database, without the migrated template's schema: for
    migrating from zero, or loading schema.sql."""
    name = "hooklane_fresh_" + uuid.uuid4().hex[:8]
    admin = await asyncpg.connect(
        host=pg_server.host, port=pg_server.port, user=pg_server.user, database="postgres"
    )
    await admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield f"postgresql://{pg_server.user}@{pg_server.host}:{pg_server.port}/{name}"
    finally:
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


@pytest.fixture
def settings(dsn: str) -> Settings:
    """Contract defaults, with short polling so tests do not wait on timers,
    and loopback (where the receivers are) allowed."""
    return Settings(
        database_url=dsn,
        allowed_networks=parse_networks(LOOPBACK),
        metrics_port=0,
        **timings.WORKER,
    )


@pytest.fixture
async def receiver() -> AsyncIterator[Receiver]:
    async with Receiver() as r:
        yield r


async def add_endpoint(
    db: asyncpg.Connection,
    name: str,
    url: str,
    *,
    tenant: str = "acme",
    secret: str | None = SECRET,
    terms: RequestTerms | None = None,
    **spec: object,
) -> int:
    """``terms``: spec.delivery's headers and TLS, as resolved from Secrets."""
    endpoint = EndpointSpec(namespace="default", name=name, url=url, tenant=tenant, **spec)
    return (await store.upsert_endpoint(db, endpoint, secret, terms=terms)).id


async def queue_unannounced(db: asyncpg.Connection) -> None:
    """An event of acme with a delivery to every endpoint, written behind
    publish's back (by hand, or while no worker listened): no notification,
    which only the ready sweep repairs."""
    await db.execute(
        "INSERT INTO events (id, tenant, type, data, fanout)"
        " SELECT 'e1', 'acme', 't', '{}', count(*) FROM endpoints"
    )
    await db.execute(
        "INSERT INTO deliveries (endpoint_id, event_tenant, event_id) SELECT id, 'acme', 'e1' FROM endpoints"
    )


async def flaky_history(
    db: asyncpg.Connection, receiver: Receiver, start_worker: Callable[..., object]
) -> int:
    """One delivery of event evt-flaky to endpoint default/flaky, answered
    503, 500, then 204 by a real worker retrying quickly; its id."""
    answers = {0: Answer(503), 1: Answer(500)}
    url = receiver.on("flaky", lambda i: answers.get(i, Answer(204)))
    await add_endpoint(db, "flaky", url)
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="evt-flaky")
    start_worker(retry=RetryPolicy(base_seconds=0.2, cap_seconds=1.0))
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"), timeout=20)
    return await db.fetchval("SELECT id FROM deliveries")


ALL_PARTITIONS = list(range(32))


async def reserve_round(
    db: asyncpg.Connection,
    limit: int = 100,
    *,
    partitions: list[int] = ALL_PARTITIONS,
    worker: str = "test-worker",
    ready: ReadyList | None = None,
    tenant_ceiling: int | None = None,
) -> list[store.Reserved]:
    """One reservation round as the worker runs it (Worker._round), by a
    worker that has just taken ``partitions``: its ready list (``ready``, or
    a new one) first lists every endpoint with pending deliveries, read from
    the start, as a partition taken does. The deliveries reserved."""
    ready = ready if ready is not None else ReadyList()
    now = datetime.now(UTC)
    for endpoint_id, partition, head in (await store.pending_endpoints(db, partitions)).endpoints:
        ready.listed(endpoint_id, partition, head, now)
    candidates = ready.take(now, limit)
    if not candidates:
        return []
    reservation = await store.reserve(
        db,
        partitions,
        [c.endpoint_id for c in candidates],
        [c.floor for c in candidates],
        limit,
        10.0,
        worker,
        tenant_ceiling=tenant_ceiling,
    )
    ready.settle(
        reservation.verdicts,
        [(r.id, r.endpoint_id) for r in reservation.deliveries],
        datetime.now(UTC),
    )
    return reservation.deliveries


async def notified(db: asyncpg.Connection, run: Callable[[], Awaitable[object]]) -> list[Wakeup]:
    """The notifications the statements ``run`` makes, in order: a canary
    notification after them proves that none is still on its way."""
    heard: list[Wakeup] = []

    def listen(_conn: object, _pid: int, _channel: str, payload: str) -> None:
        wakeup = parse_wakeup(payload)
        assert wakeup is not None, payload
        heard.append(wakeup)

    await db.add_listener("hooklane_ready", listen)
    try:
        await run()
        await db.execute("SELECT pg_notify('hooklane_ready', '4095 - 0')")
        await wait_for(lambda: heard and heard[-1] == Wakeup(4095, None, (0,)))
    finally:
        await db.remove_listener("hooklane_ready", listen)
    return heard[:-1]


class RunningWorker:
    """A Worker running as a task of the test's own event loop."""

    def __init__(self, settings: Settings) -> None:
        self.worker = Worker(settings)
        self.task = asyncio.create_task(self.worker.run())

    async def stop(self) -> None:
        self.worker.stop()
        await asyncio.wait_for(self.task, timeout=30)


@pytest.fixture
async def start_worker(settings: Settings):
    running: list[RunningWorker] = []

    def start(**overrides: object) -> RunningWorker:
        w = RunningWorker(replace(settings, **overrides))
        running.append(w)
        return w

    yield start
    for w in running:
        if not w.task.done():
            await w.stop()
        elif w.task.exception():
            raise w.task.exception()


def worker_process(dsn: str, stderr: IO[str] | None = None, **env: str) -> subprocess.Popen:
    """``hooklane worker`` as a real process; its log goes to ``stderr``."""
    environ = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_METRICS_PORT": "0",
        **timings.environment(timings.WORKER),
        "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK,
        **env,
    }
    return subprocess.Popen([sys.executable, "-m", "hooklane.cli", "worker"], env=environ, stderr=stderr)


def api_process(dsn: str, port: int, stderr: IO[str] | None = None, **env: str) -> subprocess.Popen:
    """``hooklane api`` as a real process on 127.0.0.1:``port``."""
    environ = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_API_HOST": "127.0.0.1",
        "HOOKLANE_API_PORT": str(port),
        "HOOKLANE_API_DRAIN_SECONDS": "0",
        "HOOKLANE_METRICS_PORT": "0",
        **env,
    }
    return subprocess.Popen([sys.executable, "-m", "hooklane.cli", "api"], env=environ, stderr=stderr)


@asynccontextmanager
async def in_process_api(
    dsn: str, settings: Settings, ingest: str, admin: str, **overrides: object
) -> AsyncIterator[TestClient]:
    """``hooklane api``'s app in this process on loopback, with one ingest
    and one admin token and ``overrides`` of ``settings``."""
    configured = replace(
        settings,
        api_tokens=Tokens.parse(ingest, "HOOKLANE_API_TOKENS"),
        admin_tokens=Tokens.parse(admin, "HOOKLANE_ADMIN_TOKENS"),
        **overrides,
    )
    pool = await store.create_pool(
        dsn, min_size=0, max_size=configured.api_pool_size, server_settings=store.API_SESSION
    )
    app = make_app(configured, pool, *token_sources(configured))
    try:
        async with TestClient(TestServer(app, host="127.0.0.1")) as client:
            yield client
    finally:
        await pool.close()


async def wait_api_up(session: aiohttp.ClientSession, base: str, api: subprocess.Popen) -> None:
    """Wait until the ``hooklane api`` process at ``base`` answers its
    liveness probe; fail at once should it exit."""

    async def up() -> bool:
        try:
            async with session.get(f"{base}/healthz") as response:
                return response.status == 200
        except aiohttp.ClientConnectionError:
            assert api.poll() is None, "hooklane api exited"
            return False

    await wait_for(up, timeout=30)


async def wait_for(predicate, timeout: float = 15.0, interval: float = 0.05):
    """Poll an async or plain predicate until it returns something truthy."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        value = predicate()
        if asyncio.iscoroutine(value):
            value = await value
        if value:
            return value
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(interval)

"""Shared fixtures: a real PostgreSQL (one server per session, a fresh
database per test cloned from a migrated template by pytest-postgresql), real
HTTP receivers on loopback, and workers in-process or as real processes."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace

import asyncpg
import pytest
from pytest_postgresql import factories

from hooklane import store
from hooklane.dev.postgres import LocalPostgres
from hooklane.guard import parse_networks
from hooklane.manifest import EndpointSpec
from hooklane.settings import Settings
from hooklane.worker.runner import Worker
from tests.receivers import Receiver

pytest_plugins = ["tests.kube_fixtures"]

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
def pg_server() -> Iterator[Server]:
    with LocalPostgres() as pg:
        yield Server(host="127.0.0.1", port=pg.port)


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
    conn = await asyncpg.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
def settings(dsn: str) -> Settings:
    """Contract defaults, with short polling so tests do not wait on timers,
    and loopback (where the receivers are) allowed."""
    return Settings(
        database_url=dsn,
        allowed_networks=parse_networks(LOOPBACK),
        metrics_port=0,
        poll_seconds=0.1,
        rebalance_seconds=0.2,
        maintenance_seconds=0.3,
        gauges_seconds=0.5,
        lease_grace_seconds=1.0,
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
    **spec: object,
) -> int:
    endpoint = EndpointSpec(namespace="default", name=name, url=url, tenant=tenant, **spec)
    return (await store.upsert_endpoint(db, endpoint, secret)).id


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


def worker_process(dsn: str, **env: str) -> subprocess.Popen:
    """``hooklane worker`` as a real process."""
    environ = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_METRICS_PORT": "0",
        "HOOKLANE_POLL_SECONDS": "0.1",
        "HOOKLANE_REBALANCE_SECONDS": "0.2",
        "HOOKLANE_MAINTENANCE_SECONDS": "0.3",
        "HOOKLANE_LEASE_GRACE_SECONDS": "1",
        "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK,
        **env,
    }
    return subprocess.Popen([sys.executable, "-m", "hooklane.cli", "worker"], env=environ)


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

"""What every benchmark shares: a database, workers, endpoints, statistics.

Each benchmark gets a database of its own, created on a throwaway
LocalPostgres (or on the server of an existing HOOKLANE_DATABASE_URL, passed
as --dsn) and dropped at the end, so runs never see each other's rows.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import platform
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Mapping, Sequence
from pathlib import Path

import aiohttp
import asyncpg

from hooklane import store
from hooklane.delivery import DeliverySpec
from hooklane.dev.postgres import LocalPostgres
from hooklane.spec import EndpointSpec
from hooklane.worker.partitions import MEMBER_CLASS, PARTITION_CLASS
from testsupport import databases
from testsupport.databases import drop_database

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs"
# A valid Standard Webhooks secret (24 bytes); signing cost is part of what
# we measure, so every endpoint gets one.
SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"
# Every receiver a benchmark starts listens on loopback, which the
# destination guard refuses unless allowed (HOOKLANE_ALLOWED_NETWORKS).
ALLOWED_NETWORKS = "127.0.0.0/8,::1/128"


# --------------------------------------------------------------------------
# Postgres


@contextlib.contextmanager
def postgres_server(dsn: str | None, *, durable: bool = False) -> Iterator[str]:
    """The DSN of a server to create benchmark databases on: the one given,
    or a LocalPostgres that lives as long as the block (``durable``: with
    fsync and synchronous_commit on, as a production server runs)."""
    if dsn:
        yield dsn
        return
    with LocalPostgres(durable=durable) as pg:
        yield pg.dsn


async def create_database(
    server_dsn: str, label: str, *, durable: bool = False, tree: Path | None = None
) -> str:
    """testsupport.databases.create_database; ``tree``: migrated by that
    source tree's ``hooklane migrate`` (see python_module), so that older
    code runs on the schema it shipped with."""
    dsn = await databases.create_database(server_dsn, label, durable=durable, migrate=tree is None)
    if tree is not None:
        migrate = await asyncio.create_subprocess_exec(
            *python_module("hooklane.cli", "migrate", tree=tree), env=worker_env(dsn)
        )
        if await migrate.wait() != 0:
            raise RuntimeError(f"hooklane migrate of {tree} failed")
    return dsn


@contextlib.asynccontextmanager
async def fresh_database(
    server_dsn: str, label: str, *, durable: bool = False, tree: Path | None = None
) -> AsyncIterator[str]:
    """An empty, migrated database on the server for the block; dropped after."""
    dsn = await create_database(server_dsn, label, durable=durable, tree=tree)
    try:
        yield dsn
    finally:
        await drop_database(server_dsn, dsn)


async def create_endpoints(
    conn: asyncpg.Connection,
    urls: Sequence[str],
    *,
    max_concurrency: int = 4,
    timeout_seconds: int = 5,
    slow: dict[int, tuple[int, int]] | None = None,
    delivery: dict[int, DeliverySpec] | None = None,
) -> list[int]:
    """One endpoint per URL, endpoint i in tenant ``t<i>``, created through
    store.upsert_endpoint (the same path as the operator). ``slow`` maps an
    index to (max_concurrency, timeout_seconds) overrides, ``delivery`` to
    its spec.delivery (a rate limit, adaptive concurrency)."""
    ids = []
    slow = slow or {}
    delivery = delivery or {}
    async with conn.transaction():
        for i, url in enumerate(urls):
            mc, to = slow.get(i, (max_concurrency, timeout_seconds))
            spec = EndpointSpec(
                namespace="bench",
                name=f"ep-{i}",
                url=url,
                tenant=f"t{i}",
                max_concurrency=mc,
                timeout_seconds=to,
                delivery=delivery.get(i, DeliverySpec()),
            )
            ids.append((await store.upsert_endpoint(conn, spec, SECRET)).id)
    return ids


async def wake_bulk_loaded(conn: asyncpg.Connection) -> None:
    """Deliveries bulk-inserted behind publish's back get what a publish of
    the tree under test would have added for them: a ``wakeups`` row each,
    for a tree of version 8 or before (a worker of version 9 or later lists
    a backlog when it takes the partitions)."""
    if await conn.fetchval("SELECT to_regclass('wakeups') IS NOT NULL"):
        await conn.execute(
            """
            INSERT INTO wakeups (endpoint_id, partition)
            SELECT ep.id, ep.partition FROM endpoints ep
            WHERE EXISTS (SELECT 1 FROM deliveries d
                          WHERE d.endpoint_id = ep.id AND d.state IN ('pending', 'sending'))
            """
        )


# --------------------------------------------------------------------------
# Processes


def worker_env(dsn: str, **overrides: str) -> dict[str, str]:
    """Environment of a ``hooklane worker``: contract defaults, metrics off
    unless a port is given, loopback allowed."""
    env = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_METRICS_PORT": "0",
        "HOOKLANE_ALLOWED_NETWORKS": ALLOWED_NETWORKS,
    }
    env.update({f"HOOKLANE_{k.upper()}": str(v) for k, v in overrides.items()})
    return env


# ``python -m`` puts the working directory first on sys.path, ahead of
# PYTHONPATH and of the editable install, so another tree's hooklane has to be
# put first by hand; bench/ still comes from this repository (the working
# directory) once hooklane is imported.
_FROM_TREE = (
    "import runpy, sys; sys.path.insert(0, sys.argv.pop(1)); import hooklane; sys.path.pop(0); "
    "runpy.run_module(sys.argv.pop(1), run_name='__main__', alter_sys=True)"
)


def python_module(module: str, *args: str, tree: Path | None = None) -> list[str]:
    """The command line of ``python -m module args``, importing hooklane from
    ``tree`` (a worktree of another commit, for before/after runs) if given."""
    if tree is None:
        return [sys.executable, "-m", module, *args]
    return [sys.executable, "-c", _FROM_TREE, str(tree), module, *args]


def start_worker(
    dsn: str, *, tree: Path | None = None, env: Mapping[str, str] | None = None, **overrides: str
) -> subprocess.Popen:
    """A ``hooklane worker`` with ``overrides`` of its settings and ``env``
    added to its environment (the OTEL_* variables, say)."""
    return subprocess.Popen(
        python_module("hooklane.cli", "--log-level", "WARNING", "worker", tree=tree),
        env={**worker_env(dsn, **overrides), **(env or {})},
        cwd=REPO,
    )


def start_module(module: str, *args: str, tree: Path | None = None, **popen: object) -> subprocess.Popen:
    """A bench helper (``python -m bench.X``) as a process of its own, so it
    competes for the two cores like a real deployment would. Loopback is
    allowed, as for the workers: the baseline sends with Hooklane's Sender."""
    env = {**os.environ, "HOOKLANE_ALLOWED_NETWORKS": ALLOWED_NETWORKS}
    return subprocess.Popen(python_module(module, *args, tree=tree), cwd=REPO, env=env, **popen)


def start_receivers(count: int, slow_delay: float) -> tuple[list[subprocess.Popen], list[str]]:
    """``count`` bench/receiver.py processes on free ports: (processes, base URLs)."""
    ports = free_ports(count)
    procs = [start_module("bench.receiver", "--port", str(p), "--slow-delay", str(slow_delay)) for p in ports]
    return procs, [f"http://127.0.0.1:{p}" for p in ports]


async def wait_receivers(urls: list[str], timeout: float = 20.0) -> None:
    """Wait until every receiver answers its /_stats."""
    deadline = time.monotonic() + timeout
    async with aiohttp.ClientSession() as http:
        for url in urls:
            while True:
                try:
                    async with http.get(f"{url}/_stats"):
                        break
                except aiohttp.ClientError:
                    if time.monotonic() > deadline:
                        raise
                    await asyncio.sleep(0.1)


def stop_process(proc: subprocess.Popen, grace: float = 3.0) -> None:
    """SIGTERM, then SIGKILL: a Hooklane worker drains in-flight calls for up
    to 70 s, which a benchmark has no reason to wait for."""
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


async def wait_workers_ready(dsn: str, workers: int, timeout: float = 30.0) -> float:
    """Wait until ``workers`` workers are live and every partition is owned:
    from then on the workers reserve. Returns the time it happened."""
    conn = await asyncpg.connect(dsn)
    try:
        partitions = await conn.fetchval("SELECT partition_count FROM hooklane_config")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            row = await conn.fetchrow(
                """
                SELECT count(*) FILTER (WHERE classid = $1::int::oid AND objsubid = 2) AS members,
                       count(*) FILTER (WHERE classid = $2::int::oid AND objsubid = 2) AS owned
                FROM pg_locks
                WHERE locktype = 'advisory' AND granted
                  AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
                """,
                MEMBER_CLASS,
                PARTITION_CLASS,
            )
            if row["members"] >= workers and row["owned"] >= partitions:
                return time.time()
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    raise RuntimeError(f"{workers} worker(s) did not take every partition within {timeout} s")


# --------------------------------------------------------------------------
# Statistics


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile; NaN for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = max(0, min(len(ordered) - 1, round(q / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def summary(values: Sequence[float]) -> dict[str, float]:
    return {
        "n": len(values),
        "p50": percentile(values, 50),
        "p99": percentile(values, 99),
        "max": max(values) if values else float("nan"),
    }


def machine() -> dict[str, str]:
    """What the numbers were measured on."""

    def run(*cmd: str) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, check=False).stdout.strip()
        except OSError:
            return ""

    lscpu = {k.strip(): v.strip() for k, _, v in (line.partition(":") for line in run("lscpu").splitlines())}
    from hooklane.dev.postgres import find_bindir

    return {
        "cpu": lscpu.get("Model name", platform.processor()),
        "nproc": run("nproc"),
        "memory": run("free", "-h").splitlines()[1] if run("free", "-h") else "",
        "python": platform.python_version(),
        "postgres": run(str(find_bindir() / "postgres"), "--version"),
        "kernel": platform.release(),
    }


def bench_parser(description: str, presets: Mapping[str, object]) -> argparse.ArgumentParser:
    """The command line every benchmark starts from: ``--preset`` (quick by
    default) and ``--dsn``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--preset", choices=sorted(presets), default="quick")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    return parser


def run_and_report(
    main_async: Callable[[argparse.Namespace], Awaitable[dict]],
    args: argparse.Namespace,
    brief: Callable[[dict], dict] = lambda result: result,
) -> None:
    """Run a benchmark, print (the brief part of) its result as JSON, and
    keep the whole of it in ``--json`` if asked."""
    result = asyncio.run(main_async(args))
    print(json.dumps(brief(result), indent=2, default=str))
    if args.json:
        write_json(args.json, result)


def write_json(path: str, data: object) -> None:
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(json.dumps(data, indent=1, default=str) + "\n")


def free_ports(count: int) -> list[int]:
    """Distinct free loopback ports (held open together so none repeats)."""
    import socket

    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()

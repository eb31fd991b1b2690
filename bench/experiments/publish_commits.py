"""What a publish costs the application's own commits (issue 38).

Connections each loop over an application transaction: BEGIN and its
statements in one round trip, then COMMIT, timed on its own. Each
connection is its own tenant, with ``endpoints`` endpoints. Three kinds:

- ``insert``: an order row alone;
- ``publish``: the order row and ``hooklane_try_publish_v1`` of one event;
- ``rows``: the order row and the rows a publish writes (the event, a
  delivery per endpoint), in plain SQL, without any wake-up.

Every kind at every concurrency, on a durable server (fsync and
synchronous_commit on), against the schema of each tree given (``--tree``,
``--compare``: a worktree of another commit; by default this one), one
database per tree on one server, kinds interleaved, so that the trees are
compared side by side in one run. A session LISTENs on each database, as a
worker does. pg_stat_activity is sampled every 20 ms for the connections
waiting on a ``Lock:object`` (the notify queue's lock).

Then an idle worker of each tree (its own code, on its own database with
the same endpoints) is measured: the transactions its sessions commit per
second and the CPU its backends and its process use, over
``idle_seconds``. ``--probe-cost``: this tree's worker probing every 5 ms
against one left idle, the difference per probe: what a probe costs.

Run: ``python -m bench.experiments.publish_commits --tree /tmp/main --compare .``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

import asyncpg

from bench.common import (
    bench_parser,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
    start_worker,
    stop_process,
    summary,
    wait_workers_ready,
)
from hooklane import store
from hooklane.spec import EndpointSpec

APP = "bench-commits"
KINDS = ("insert", "publish", "rows")
DATA = json.dumps({"order": 42, "items": [{"sku": "A-1", "qty": 2}], "note": "x" * 200})


@dataclass(frozen=True)
class Config:
    seconds: float
    concurrencies: tuple[int, ...]
    rounds: int
    endpoints: int
    idle_seconds: float


PRESETS = {
    "smoke": Config(seconds=1.0, concurrencies=(4,), rounds=1, endpoints=2, idle_seconds=2.0),
    "quick": Config(seconds=5.0, concurrencies=(16, 64), rounds=1, endpoints=4, idle_seconds=20.0),
    "full": Config(seconds=10.0, concurrencies=(16, 64), rounds=2, endpoints=4, idle_seconds=60.0),
}


def describe(tree: Path | None) -> str:
    return "this tree" if tree is None else str(tree)


async def prepare(dsn: str, tenants: int, endpoints: int) -> None:
    """The application's table, and each tenant's endpoints."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS bench_orders (id bigserial PRIMARY KEY, tenant text, body jsonb)"
        )
        have = await conn.fetchval("SELECT count(*) FROM endpoints")
        for n in range(have, tenants * endpoints):
            tenant = f"tenant-{n // endpoints}"
            spec = EndpointSpec(
                namespace="bench", name=f"ep-{n}", url=f"http://127.0.0.1:9/{n}", tenant=tenant
            )
            await store.upsert_endpoint(conn, spec, None)
    finally:
        await conn.close()


async def slow_commits(dsn: str, delay_us: int) -> None:
    """Every commit on the database waits ``delay_us`` before its WAL flush
    (commit_delay, with no sibling needed), as on a slow disk or behind a
    synchronous standby far away: the notify lock is held across it."""
    conn = await asyncpg.connect(dsn)
    try:
        name = await conn.fetchval("SELECT current_database()")
        await conn.execute(f'ALTER DATABASE "{name}" SET commit_delay = {int(delay_us)}')
        await conn.execute(f'ALTER DATABASE "{name}" SET commit_siblings = 0')
    finally:
        await conn.close()


def statements(kind: str, tenant: str) -> str:
    """BEGIN and the transaction's statements, as literals: one round trip."""
    event = f"e-{uuid.uuid4().hex}"
    body = f"BEGIN; INSERT INTO bench_orders (tenant, body) VALUES ('{tenant}', '{DATA}')"
    if kind == "publish":
        body += f"; SELECT * FROM hooklane_try_publish_v1('{tenant}', 'order.created', '{DATA}', '{event}')"
    elif kind == "rows":
        body += (
            f"; WITH matched AS (SELECT id FROM endpoints WHERE tenant = '{tenant}' AND state = 'active'),"
            f" event AS (INSERT INTO events (id, tenant, type, data, fanout)"
            f" SELECT '{event}', '{tenant}', 'order.created', '{DATA}', count(*) FROM matched RETURNING 1)"
            f" INSERT INTO deliveries (endpoint_id, event_tenant, event_id)"
            f" SELECT m.id, '{tenant}', '{event}' FROM matched m WHERE EXISTS (SELECT FROM event)"
        )
    return body


async def _client(
    dsn: str, kind: str, tenant: str, until: float, commits: list[float], cpu: list[float]
) -> None:
    """Loop over the application's transaction until ``until``; add the CPU
    its backend used meanwhile to ``cpu``."""
    conn = await asyncpg.connect(dsn, server_settings={"application_name": APP})
    try:
        backend = {await conn.fetchval("SELECT pg_backend_pid()")}
        used = _cpu_seconds(backend)
        while time.monotonic() < until:
            await conn.execute(statements(kind, tenant))
            started = time.perf_counter()
            await conn.execute("COMMIT")
            commits.append(time.perf_counter() - started)
        cpu.append(_cpu_seconds(backend) - used)
    finally:
        await conn.close()


async def _sample(dsn: str, stop: asyncio.Event) -> tuple[int, int, int]:
    """(samples, active connections seen, of those waiting on Lock:object)."""
    conn = await asyncpg.connect(dsn)
    samples = active = waiting = 0
    try:
        while not stop.is_set():
            row = await conn.fetchrow(
                "SELECT count(*) FILTER (WHERE state = 'active') AS active,"
                " count(*) FILTER (WHERE wait_event_type = 'Lock' AND wait_event = 'object') AS waiting"
                " FROM pg_stat_activity WHERE application_name = $1",
                APP,
            )
            samples, active, waiting = samples + 1, active + row["active"], waiting + row["waiting"]
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
    return samples, active, waiting


async def _wal_lsn(dsn: str) -> str:
    conn = await asyncpg.connect(dsn)
    try:
        return await conn.fetchval("SELECT pg_current_wal_insert_lsn()::text")
    finally:
        await conn.close()


async def _wal_bytes(dsn: str, since: str) -> int:
    conn = await asyncpg.connect(dsn)
    try:
        return int(
            await conn.fetchval(
                "SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1::text::pg_lsn)", since
            )
        )
    finally:
        await conn.close()


async def measure(dsn: str, kind: str, concurrency: int, seconds: float) -> dict:
    """Also, per transaction: the CPU of the connections' backends (what
    the throughput of a machine the benchmark saturates follows; /proc, 10
    ms ticks over thousands of transactions) and the WAL written, by every
    session of the server."""
    commits: list[float] = []
    cpu: list[float] = []
    stop = asyncio.Event()
    wal_since = await _wal_lsn(dsn)
    sampler = asyncio.create_task(_sample(dsn, stop))
    started = time.monotonic()
    until = started + seconds
    await asyncio.gather(
        *(_client(dsn, kind, f"tenant-{i}", until, commits, cpu) for i in range(concurrency))
    )
    elapsed = time.monotonic() - started
    stop.set()
    samples, active, waiting = await sampler
    wal = await _wal_bytes(dsn, wal_since)
    latency = summary(commits)
    return {
        "kind": kind,
        "concurrency": concurrency,
        "tx_per_second": len(commits) / elapsed,
        "commit_p50_ms": latency["p50"] * 1000,
        "commit_p99_ms": latency["p99"] * 1000,
        "samples": samples,
        "lock_object_waiting_share": waiting / active if active else 0.0,
        "backend_cpu_ms_per_tx": sum(cpu) * 1000 / len(commits) if commits else 0.0,
        "wal_bytes_per_tx": wal / len(commits) if commits else 0.0,
    }


async def _backend_cpu(conn: asyncpg.Connection, dbname: str) -> tuple[float, set[int]]:
    """CPU seconds used so far by the database's other backends."""
    pids = {
        r["pid"]
        for r in await conn.fetch(
            "SELECT pid FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()", dbname
        )
    }
    return _cpu_seconds(pids), pids


def _cpu_seconds(pids: set[int]) -> float:
    """User and system CPU of these processes (/proc/PID/stat), in seconds."""
    ticks = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        ticks += int(fields[11]) + int(fields[12])
    return ticks / os.sysconf("SC_CLK_TCK")


async def idle_worker(server: str, tree: Path | None, cfg: Config, **overrides: str) -> dict:
    """One worker with nothing to do, with ``overrides`` of its settings:
    what it costs Postgres, and itself."""
    async with fresh_database(server, "idle", durable=True, tree=tree) as dsn:
        await prepare(dsn, 16, cfg.endpoints)
        worker = start_worker(dsn, tree=tree, **overrides)
        try:
            await wait_workers_ready(dsn, 1)
            await asyncio.sleep(min(cfg.idle_seconds, 5.0))  # past its start's listings
            conn = await asyncpg.connect(dsn)
            try:
                dbname = await conn.fetchval("SELECT current_database()")
                query = "SELECT xact_commit + xact_rollback FROM pg_stat_database WHERE datname = $1"
                await conn.execute("SELECT pg_stat_clear_snapshot()")
                before = await conn.fetchval(query, dbname)
                cpu_before, pids_before = await _backend_cpu(conn, dbname)
                worker_before = _cpu_seconds({worker.pid})
                started = time.monotonic()
                await asyncio.sleep(cfg.idle_seconds)
                elapsed = time.monotonic() - started
                worker_after = _cpu_seconds({worker.pid})
                await conn.execute("SELECT pg_stat_clear_snapshot()")
                # Statistics are flushed at most once a second.
                await asyncio.sleep(1.1)
                after = await conn.fetchval(query, dbname)
                cpu_after, pids_after = await _backend_cpu(conn, dbname)
            finally:
                await conn.close()
        finally:
            stop_process(worker)
    # This session's own transactions between the two readings: 5.
    return {
        "transactions_per_second": (after - before - 5) / elapsed,
        "backend_cpu_ms_per_second": (cpu_after - cpu_before) * 1000 / elapsed,
        "worker_cpu_ms_per_second": (worker_after - worker_before) * 1000 / elapsed,
        "backends_same": pids_before == pids_after,
    }


async def main_async(args: argparse.Namespace) -> dict:
    cfg: Config = PRESETS[args.preset]
    if args.seconds:
        cfg = Config(**{**asdict(cfg), "seconds": args.seconds})
    trees = [args.tree, *([args.compare] if args.compare else [])]
    runs: list[dict] = []
    idle: dict[str, dict] = {}
    with postgres_server(args.dsn, durable=True) as server:
        dsns: list[str] = []
        contexts = [fresh_database(server, f"commits_{i}", durable=True, tree=t) for i, t in enumerate(trees)]
        for context in contexts:
            dsns.append(await context.__aenter__())
        listeners = []
        try:
            for dsn in dsns:
                if args.commit_delay_us:
                    await slow_commits(dsn, args.commit_delay_us)
                await prepare(dsn, max(cfg.concurrencies), cfg.endpoints)
                listener = await asyncpg.connect(dsn)
                await listener.add_listener("hooklane_ready", lambda *_: None)
                listeners.append(listener)
            for round_ in range(0 if args.idle_only else cfg.rounds):
                for concurrency in cfg.concurrencies:
                    for kind in KINDS:
                        for tree, dsn in zip(trees, dsns, strict=True):
                            run = await measure(dsn, kind, concurrency, cfg.seconds)
                            runs.append({"tree": describe(tree), "round": round_ + 1, **run})
        finally:
            for listener in listeners:
                await listener.close()
            for context in reversed(contexts):
                await context.__aexit__(None, None, None)
        if not args.no_idle:
            for tree in trees:
                idle[describe(tree)] = await idle_worker(server, tree, cfg)
        if args.probe_cost:
            idle["probing every 5 ms"] = await idle_worker(
                server, None, cfg, probe_min_seconds="0.005", probe_max_seconds="0.005"
            )
            idle["idle"] = await idle_worker(server, None, cfg)
            idle["per probe"] = probe_cost(idle["probing every 5 ms"], idle["idle"])
    return {
        "config": asdict(cfg),
        "commit_delay_us": args.commit_delay_us,
        "machine": machine(),
        "runs": runs,
        "idle": idle,
    }


def probe_cost(probing: dict, idle: dict) -> dict:
    """What one probe costs: a worker probing every 5 ms against one left
    idle, per transaction more (each probe is one)."""
    probes = probing["transactions_per_second"] - idle["transactions_per_second"]
    return {
        "probes_per_second": probes,
        "worker_cpu_us": (probing["worker_cpu_ms_per_second"] - idle["worker_cpu_ms_per_second"])
        * 1000
        / probes,
        "backend_cpu_us": (probing["backend_cpu_ms_per_second"] - idle["backend_cpu_ms_per_second"])
        * 1000
        / probes,
    }


def table(result: dict) -> str:
    lines = [
        "| tree | connections | kind | round | tx/s | commit p50 ms | p99 ms | Lock:object share"
        " | backend CPU ms/tx | WAL bytes/tx |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in result["runs"]:
        lines.append(
            f"| {r['tree']} | {r['concurrency']} | {r['kind']} | {r['round']} | {r['tx_per_second']:.0f}"
            f" | {r['commit_p50_ms']:.2f} | {r['commit_p99_ms']:.2f} | {r['lock_object_waiting_share']:.0%}"
            f" | {r['backend_cpu_ms_per_tx']:.3f} | {r['wal_bytes_per_tx']:.0f} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = bench_parser(__doc__.splitlines()[0], PRESETS)
    parser.add_argument("--tree", type=Path, help="a source tree whose schema and worker to run")
    parser.add_argument("--compare", type=Path, help="a second tree, run side by side with the first")
    parser.add_argument("--seconds", type=float, help="each measurement's length (the preset's if unset)")
    parser.add_argument("--no-idle", action="store_true", help="leave out the idle worker")
    parser.add_argument("--idle-only", action="store_true", help="measure the idle worker alone")
    parser.add_argument(
        "--probe-cost",
        action="store_true",
        help="also measure this tree's worker probing every 5 ms against one left idle: a probe's cost",
    )
    parser.add_argument(
        "--commit-delay-us", type=int, default=0, help="slow every commit's flush by this much (commit_delay)"
    )
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(
        main_async, args, lambda result: {"table": table(result).splitlines(), "idle": result["idle"]}
    )


if __name__ == "__main__":
    main()

"""Throughput against the ceiling: drain a backlog, compare with bare aiohttp.

Many fast endpoints on one receiver that is never the bottleneck (nginx
answering 204; an aiohttp receiver process when nginx is not installed), a
large backlog written by a bulk INSERT (not through publish: the backlog is
the starting state, not what is measured), then ``hooklane worker``
process(es) drain it. Measured: deliveries/s end to end (from the moment the
workers own every partition until the last delivery is recorded in
Postgres), worker RSS (psutil, sampled), CPU seconds per process group
(worker, Postgres, receiver) and the worker's own reservation histogram. In
the same run, the raw rate of a bare aiohttp client posting the same bodies
to the same receiver: the ceiling for a Python sender.

Run: ``python -m bench.throughput --preset full``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import asyncpg
import psutil

from bench import nginx
from bench.common import (
    create_endpoints,
    free_ports,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
    start_module,
    start_worker,
    stop_process,
    wait_workers_ready,
    wake_bulk_loaded,
)
from hooklane.settings import Settings


@dataclass(frozen=True)
class Config:
    endpoints: int
    backlog: int  # deliveries waiting when the workers start
    workers: tuple[int, ...]  # worker process counts, one drain each
    concurrency: int = Settings().worker_concurrency  # the worker's default; the raw client gets the same
    timeout: float = 600.0  # give up a drain after this long


PRESETS = {
    "full": Config(endpoints=1000, backlog=60_000, workers=(1, 2)),
    "quick": Config(endpoints=500, backlog=20_000, workers=(1, 2)),
    "smoke": Config(endpoints=20, backlog=400, workers=(1,), timeout=30),
}

# The backlog, in two statements: one event per delivery, each to one endpoint
# (endpoint i is tenant t<i>). The data is about the size of a small order.
BACKLOG_EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout)
SELECT 'evt_' || g, 't' || (g % $2), 'order.updated',
       jsonb_build_object('n', g, 'order', jsonb_build_object('id', g, 'status', 'paid',
                                                              'note', repeat('x', 160))),
       1
FROM generate_series(1, $1) g
"""
BACKLOG_DELIVERIES = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id)
SELECT ep.id, e.tenant, e.id FROM events e JOIN endpoints ep ON ep.tenant = e.tenant
"""


# --------------------------------------------------------------------------
# Receiver


@contextlib.contextmanager
def receiver(kind: str) -> Iterator[tuple[str, list[int], str]]:
    """(base URL, pids, kind) of the receiver for the whole benchmark."""
    port = free_ports(1)[0]
    if kind == "auto":
        kind = "nginx" if nginx.available() else "aiohttp"
    if kind == "nginx":
        with nginx.Nginx(port) as server:
            yield server.url, server.pids(), kind
        return
    proc = start_module("bench.receiver", "--port", str(port), stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # "receiver ready"
        yield f"http://127.0.0.1:{port}", [proc.pid], kind
    finally:
        stop_process(proc)


# --------------------------------------------------------------------------
# Measuring processes


class Usage:
    """CPU seconds of process groups between start() and stop(), and the
    peak RSS of the workers, sampled while the drain runs."""

    def __init__(self, groups: dict[str, list[int]]) -> None:
        self.groups = {k: [psutil.Process(p) for p in pids] for k, pids in groups.items()}
        self.peak_rss: dict[int, int] = {}
        self._start: dict[str, float] = {}

    @staticmethod
    def _cpu(procs: list[psutil.Process]) -> float:
        total = 0.0
        for p in procs:
            with contextlib.suppress(psutil.Error):
                t = p.cpu_times()
                total += t.user + t.system
        return total

    def start(self) -> None:
        self._start = {k: self._cpu(v) for k, v in self.groups.items()}

    def sample_rss(self) -> None:
        for p in self.groups.get("worker", []):
            with contextlib.suppress(psutil.Error):
                self.peak_rss[p.pid] = max(self.peak_rss.get(p.pid, 0), p.memory_info().rss)

    def stop(self) -> dict[str, float]:
        return {k: round(self._cpu(v) - self._start[k], 2) for k, v in self.groups.items()}


def postgres_pids(port: int) -> list[int]:
    """Every process of the Postgres server listening on ``port``: the
    postmaster and its backends (their CPU is the database's share)."""
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            master = psutil.Process(conn.pid)
            return [master.pid, *(c.pid for c in master.children())]
    return []


def scrape(port: int) -> dict[str, float]:
    """The worker's reservation and delivery histograms (sum and count)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    wanted = ("hooklane_reservation_duration_seconds_", "hooklane_delivery_duration_seconds_")
    out = {}
    for line in text.splitlines():
        if line.startswith(wanted) and ("_sum " in line or "_count " in line):
            name, value = line.split()
            out[name] = float(value)
    return out


# --------------------------------------------------------------------------
# Runs


async def load_backlog(dsn: str, base: str, cfg: Config) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await create_endpoints(conn, [f"{base}/h/{i}" for i in range(cfg.endpoints)])
        await conn.execute(BACKLOG_EVENTS, cfg.backlog, cfg.endpoints)
        await conn.execute(BACKLOG_DELIVERIES)
        await wake_bulk_loaded(conn)
        await conn.execute("VACUUM ANALYZE")
    finally:
        await conn.close()


async def drain(
    server_dsn: str,
    base: str,
    receiver_pids: list[int],
    cfg: Config,
    workers: int,
    profile_dir: str | None,
    durable: bool,
) -> dict:
    async with fresh_database(server_dsn, "throughput", durable=durable) as dsn:
        await load_backlog(dsn, base, cfg)
        ports = free_ports(workers)
        procs = [
            start_worker(
                dsn, worker_concurrency=str(cfg.concurrency), metrics_port=str(p), metrics_host="127.0.0.1"
            )
            for p in ports
        ]
        spy = None
        conn = await asyncpg.connect(dsn)
        try:
            pg_port = int(await conn.fetchval("SHOW port"))
            ready = await wait_workers_ready(dsn, workers)
            usage = Usage(
                {
                    "worker": [p.pid for p in procs],
                    "postgres": postgres_pids(pg_port),
                    "receiver": receiver_pids,
                }
            )
            usage.start()
            if profile_dir and workers == 1:
                spy = start_py_spy(procs[0].pid, Path(profile_dir) / f"worker-{workers}w.txt")
            done_at, delivered = await wait_drained(conn, usage, cfg, ready)
            cpu = usage.stop()
            span = await conn.fetchrow(
                "SELECT extract(epoch FROM max(delivered_at) - min(delivered_at)) AS s, count(*) AS n "
                "FROM deliveries WHERE state = 'delivered'"
            )
            histograms = [scrape(p) for p in ports]
        finally:
            await conn.close()
            if spy is not None:
                # py-spy writes its output on SIGINT (not on SIGTERM).
                spy.send_signal(signal.SIGINT)
                spy.wait(30)
            for p in procs:
                stop_process(p)
    elapsed = done_at - ready
    return {
        "workers": workers,
        "delivered": delivered,
        "seconds": round(elapsed, 2),
        "per_second": delivered / elapsed,
        "per_second_first_to_last": float(span["n"]) / float(span["s"]) if span["s"] else None,
        "peak_rss_mb": {str(pid): round(rss / 2**20, 1) for pid, rss in usage.peak_rss.items()},
        "cpu_seconds": cpu,
        "reservation": histograms,
    }


async def wait_drained(
    conn: asyncpg.Connection, usage: Usage, cfg: Config, ready: float
) -> tuple[float, int]:
    """Poll until every delivery is recorded; a count every 0.25 s costs the
    database little next to the drain itself."""
    delivered = 0
    while time.time() - ready < cfg.timeout:
        usage.sample_rss()
        delivered = await conn.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'")
        if delivered >= cfg.backlog:
            return time.time(), delivered
        await asyncio.sleep(0.25)
    raise RuntimeError(f"drain did not finish in {cfg.timeout} s ({delivered} of {cfg.backlog})")


def start_py_spy(pid: int, out: Path) -> subprocess.Popen:
    """Sample the worker (collapsed stacks, idle frames excluded) while it drains."""
    out.parent.mkdir(parents=True, exist_ok=True)
    return subprocess.Popen(
        [
            "py-spy",
            "record",
            "--pid",
            str(pid),
            "--rate",
            "200",
            "--format",
            "raw",
            "--output",
            str(out),
            "--nonblocking",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def raw_ceiling(base: str, cfg: Config, processes: int = 1) -> dict:
    """The bare client, as its own process(es) like the worker, at its best:
    tried with the worker's concurrency and with 64 (fewer requests in flight
    can be faster for a client with nothing else to do), the faster kept."""
    tries = [_raw_run(base, cfg, processes, c) for c in sorted({64, cfg.concurrency})]
    best = max(tries, key=lambda t: t["per_second"])
    return {**best, "by_concurrency": {t["concurrency"]: round(t["per_second"]) for t in tries}}


def _raw_run(base: str, cfg: Config, processes: int, concurrency: int) -> dict:
    count = min(cfg.backlog, 40_000) // processes
    procs = [
        start_module(
            "bench.rawclient",
            "--base",
            base,
            "--endpoints",
            str(cfg.endpoints),
            "--count",
            str(count),
            "--concurrency",
            str(concurrency),
            stdout=subprocess.PIPE,
        )
        for _ in range(processes)
    ]
    results = [json.loads(p.communicate()[0]) for p in procs]
    # Together: all requests over the slowest process's time (they start together).
    total = sum(r["count"] for r in results)
    seconds = max(r["seconds"] for r in results)
    return {
        "processes": processes,
        "concurrency": concurrency,
        "count": total,
        "seconds": round(seconds, 2),
        "per_second": total / seconds,
        "statuses": [r["statuses"] for r in results],
    }


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.backlog:
        cfg = replace(cfg, backlog=args.backlog)
    if args.workers:
        cfg = replace(cfg, workers=tuple(args.workers))
    if args.concurrency:
        cfg = replace(cfg, concurrency=args.concurrency)
    durable = args.synchronous_commit == "on"
    result: dict = {
        "preset": args.preset,
        "config": asdict(cfg),
        "synchronous_commit": args.synchronous_commit,
        "machine": machine(),
    }
    with (
        receiver(args.receiver) as (base, receiver_pids, kind),
        postgres_server(args.dsn, durable=durable) as server,
    ):
        result["receiver"] = kind
        result["ceiling"] = [raw_ceiling(base, cfg, n) for n in sorted(set(cfg.workers))]
        print("ceiling:", [round(c["per_second"]) for c in result["ceiling"]], flush=True)
        result["drains"] = []
        for workers in cfg.workers:
            d = await drain(server, base, receiver_pids, cfg, workers, args.profile_dir, durable)
            print(
                f"{workers} worker(s): {d['per_second']:.0f}/s, rss {d['peak_rss_mb']}, cpu {d['cpu_seconds']}",
                flush=True,
            )
            result["drains"].append(d)
    one = next(d for d in result["drains"] if d["workers"] == 1)
    ceiling = result["ceiling"][0]["per_second"]
    result["verdict"] = {
        "one_worker_per_second": one["per_second"],
        "ceiling_per_second": ceiling,
        "ratio_to_ceiling": one["per_second"] / ceiling,
        "target_60pct_of_ceiling": one["per_second"] >= 0.6 * ceiling,
        "target_1500_per_second": one["per_second"] >= 1500,
        "peak_rss_mb": max(v for d in result["drains"] for v in d["peak_rss_mb"].values()),
        "target_rss_under_150mb": all(v < 150 for d in result["drains"] for v in d["peak_rss_mb"].values()),
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description="drain throughput against a bare aiohttp client")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    parser.add_argument("--receiver", choices=("auto", "nginx", "aiohttp"), default="auto")
    parser.add_argument("--backlog", type=int, help="deliveries to drain, overriding the preset")
    parser.add_argument("--workers", type=int, action="append", help="worker processes (repeatable)")
    parser.add_argument("--concurrency", type=int, help="HOOKLANE_WORKER_CONCURRENCY and the raw client's")
    parser.add_argument(
        "--profile-dir", help="record the one-worker drain with py-spy into this folder (slows it a little)"
    )
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="off",
        help="on: a PostgreSQL with fsync and synchronous_commit on, as production runs",
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    sys.exit(main())

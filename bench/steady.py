"""Cost at a steady rate: CPU per delivery of the worker and of PostgreSQL.

A fixed publish rate (open loop: each event is published at its scheduled
time, on a monotonic clock, whether or not earlier ones were delivered) over
many healthy endpoints on one aiohttp receiver that answers 204 at once, one
``hooklane worker`` with its defaults. Each event goes to one endpoint (round
robin) and is published through ``hooklane.publish`` in a transaction of its
own, by a publisher process separate from this driver.

After a warm-up, over a fixed window only: deliveries/s at the receiver; CPU
seconds of the worker process and of every process of the PostgreSQL server
(postmaster, backends, background and exited children, from /proc via
psutil), per delivery and as cores (CPU seconds over wall seconds);
reservation rounds per second (the worker's
``hooklane_reservation_duration_seconds_count`` before and after the window);
publish-to-receiver latency (commit returned to the publisher, to arrival at
the receiver, both on this machine's wall clock). Then it waits until every
published event has arrived, and says if one never did.

``--tree DIR`` runs the worker, the publisher and the migrations from another
source tree (a ``git worktree`` of an older commit); ``--compare DIR``
(repeatable) runs another tree interleaved with the first, per rate and
repeat in alternating order, and reports them side by side with their
ratios to the first: the way to compare
before and after on a shared, noisy machine. ``--traced`` runs the last
tree a second time with tracing on (every delivery a span, exported over
OTLP/HTTP to the tests' collector, testsupport/otlp.py, run in this driver,
whose CPU is not counted): the cost of tracing, side by side.

Run: ``python -m bench.steady --preset full [--synchronous-commit on] [--compare ../before] [--traced]``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import NamedTuple

import aiohttp
import asyncpg
import psutil

import hooklane
from bench.common import (
    REPO,
    create_endpoints,
    free_ports,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
    start_module,
    start_worker,
    stop_process,
    summary,
    wait_workers_ready,
)
from bench.throughput import postgres_pids, receiver, scrape
from hooklane.settings import Settings
from testsupport.otlp import Collector

EVENT_TYPE = "order.updated"
ROUNDS = "hooklane_reservation_duration_seconds_count"
STEADY_SHARE = 0.95  # of the scheduled deliveries that must arrive within the window


@dataclass(frozen=True)
class Config:
    rates: tuple[float, ...]  # events/s, one run each
    seconds: float  # the measured window
    warmup: float  # seconds of publishing before the window opens
    endpoints: int = 200
    repeat: int = 1  # runs per rate (and per tree)
    # Publishing goes on this long after the window closes, so that the
    # window's end is as steady as its middle.
    tail: float = 1.0
    publishers: int = 8  # publishing connections: enough that 1,000/s keeps its schedule
    drain_timeout: float = 60.0  # after publishing, for the last deliveries to arrive
    # Delivered events written before the worker starts, then ANALYZE: the
    # tables of a deployment that has been running (see write_history).
    history: int = 50_000
    concurrency: int = Settings().worker_concurrency


PRESETS = {
    "full": Config(rates=(10, 100, 1000), seconds=40, warmup=5),
    "quick": Config(rates=(100,), seconds=15, warmup=3),
    "smoke": Config(
        rates=(20,), seconds=3, warmup=1, endpoints=50, publishers=2, drain_timeout=20, history=1_000
    ),
}


# --------------------------------------------------------------------------
# The publisher (its own process, hooklane from the tree under test)


def schedule_offset(n: int, rate: float) -> float:
    """Seconds from the start at which event ``n`` is due."""
    return n / rate


def event_data(n: int, now: float) -> dict:
    """About the size of a small order, like the throughput bench's backlog."""
    return {"t": now, "n": n, "order": {"id": n, "status": "paid", "note": "x" * 160}}


async def publish_one(pool: asyncpg.Pool, n: int, endpoints: int) -> tuple[float, float]:
    """(transaction start, commit returned), wall clock."""
    async with pool.acquire() as conn:
        started = time.time()
        async with conn.transaction():
            await hooklane.publish(
                conn, tenant=f"t{n % endpoints}", type=EVENT_TYPE, data=event_data(n, started)
            )
        return started, time.time()


async def publisher_async(args: argparse.Namespace) -> list[list[float]]:
    """Create the endpoints, say ready (and which hooklane this is), wait for
    the start time on stdin, publish on schedule; returns every event's
    [number, due, transaction start, commit returned]."""
    conn = await asyncpg.connect(args.dsn)
    try:
        await create_endpoints(conn, [f"{args.base}/h/{i}" for i in range(args.endpoints)])
    finally:
        await conn.close()
    pool = await asyncpg.create_pool(args.dsn, min_size=args.connections, max_size=args.connections)
    print(json.dumps({"hooklane": hooklane.__file__}), flush=True)
    start = float(await asyncio.to_thread(sys.stdin.readline))
    mono_start = time.monotonic() + (start - time.time())
    total = int(args.rate * args.seconds)
    tasks = []
    try:
        for n in range(total):
            delay = mono_start + schedule_offset(n, args.rate) - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(publish_one(pool, n, args.endpoints)))
        times = await asyncio.gather(*tasks)
    finally:
        await pool.close()
    return [[n, start + schedule_offset(n, args.rate), s, c] for n, (s, c) in enumerate(times)]


def publisher_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.steady publish")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--base", required=True)
    parser.add_argument("--endpoints", type=int, required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(asyncio.run(publisher_async(args))))


# --------------------------------------------------------------------------
# Measuring


def cpu_seconds(proc: psutil.Process) -> float:
    """User and system CPU of a process, of its live children and of the
    children it has reaped: a total that only grows, so that a backend or an
    autovacuum worker that starts or exits inside the window is counted for
    exactly its share of it."""
    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        with contextlib.suppress(psutil.Error):
            c = child.cpu_times()
            total += c.user + c.system
    return total


def snapshot(groups: dict[str, list[psutil.Process]], *metrics_ports: int) -> dict:
    """CPU seconds so far of each group of processes, and the reservation
    rounds so far of the workers serving metrics on ``metrics_ports``."""
    cpu = {name: sum(cpu_seconds(p) for p in procs) for name, procs in groups.items()}
    rounds = sum(v for port in metrics_ports for k, v in scrape(port).items() if k.startswith(ROUNDS))
    return {"at": time.time(), "cpu": cpu, "rounds": rounds}


async def sleep_until(wall: float) -> None:
    await asyncio.sleep(max(0.0, wall - time.time()))


def first_arrivals(stats: dict) -> dict[int, float]:
    """Event number to its first arrival (a retry could bring one twice)."""
    out: dict[int, float] = {}
    for (at, _lag, _slow), n in zip(stats["arrivals"], stats["numbers"], strict=True):
        if n is not None and n not in out:
            out[n] = at
    return out


def analyse(rate: float, before: dict, after: dict, events: list[list[float]], stats: dict) -> dict:
    """The window's figures, from two snapshots, the publisher's times and
    the receiver's arrivals. Pure: no I/O."""
    opened, closed = before["at"], after["at"]
    wall = closed - opened
    arrived = first_arrivals(stats)
    in_window = sum(1 for at, _lag, _slow in stats["arrivals"] if opened <= at < closed)
    committed = [(int(n), c) for n, _due, _s, c in events if opened <= c < closed]
    return {
        "rate": rate,
        # Open loop only while the publisher keeps its schedule: a machine
        # too busy for it turns the run into a slower, closed-loop one.
        "steady": in_window >= STEADY_SHARE * rate * wall,
        "published": len(events),
        "delivered": sum(1 for n, *_ in events if int(n) in arrived),
        **window_cost(before, after, in_window),
        "latency_ms": _ms(summary([arrived[n] - c for n, c in committed if n in arrived])),
        "publish_transaction_ms": _ms(summary([c - s for _n, _due, s, c in events])),
        "publisher_late_ms": _ms(summary([max(0.0, s - due) for _n, due, s, _c in events])),
    }


def window_cost(before: dict, after: dict, deliveries: int) -> dict:
    """What a window between two snapshots cost, for ``deliveries`` made in
    it: CPU seconds of each group, per delivery and as cores (the worker and
    PostgreSQL, and their total), and the reservation rounds."""
    wall = after["at"] - before["at"]
    cpu = {k: after["cpu"][k] - before["cpu"][k] for k in after["cpu"]}
    measured = {"worker": cpu["worker"], "postgres": cpu["postgres"]}
    measured["total"] = measured["worker"] + measured["postgres"]
    rounds = after["rounds"] - before["rounds"]
    return {
        "window_seconds": round(wall, 3),
        "deliveries_in_window": deliveries,
        "deliveries_per_s": deliveries / wall,
        "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
        "cpu_ms_per_delivery": {
            k: 1000 * v / deliveries if deliveries else None for k, v in measured.items()
        },
        "cores": {k: v / wall for k, v in measured.items()},
        "reservation_rounds_per_s": rounds / wall,
        "reservation_rounds_per_delivery": rounds / deliveries if deliveries else None,
    }


def _ms(s: dict[str, float]) -> dict[str, float]:
    return {k: (v if k == "n" else round(v * 1000, 2)) for k, v in s.items()}


# --------------------------------------------------------------------------
# One run

# Spread over the endpoints' tenants, as the publisher's events are.
HISTORY_EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout, created_at)
SELECT 'history-' || g, 't' || (g % $2), $3, '{}', 1, now() - interval '1 hour'
FROM generate_series(1, $1) AS g
"""
HISTORY_DELIVERIES = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, created_at,
                        delivered_at, last_status)
SELECT ep.id, ep.tenant, e.id, 'delivered', 1, e.created_at, e.created_at, 204
FROM events e JOIN endpoints ep ON ep.tenant = e.tenant
WHERE e.id LIKE 'history-%'
"""


async def write_history(conn: asyncpg.Connection, events: int, endpoints: int) -> None:
    """Delivered events from before the run, then ANALYZE, as in a
    deployment that has been running for a while. The worker keeps one plan
    per session for its kept-plan functions (migration 0004); made on the
    empty tables of a new database, before autovacuum (a minute apart) first
    analyses them, those plans scan whole tables, and the run measured a new
    database's first minute rather than a steady rate: per-delivery CPU of
    the same tree then varied by half between runs."""
    await conn.execute(HISTORY_EVENTS, events, endpoints, EVENT_TYPE)
    await conn.execute(HISTORY_DELIVERIES)
    await conn.execute("VACUUM ANALYZE")


async def run_once(
    server_dsn: str,
    base: str,
    receiver_pids: list[int],
    cfg: Config,
    rate: float,
    tree: Path | None,
    durable: bool,
    env: dict[str, str] | None = None,
    prepare: Callable[[asyncpg.Connection], Awaitable[None]] | None = None,
) -> dict:
    """One measured run of ``tree``'s worker, with ``env`` added to its
    environment; ``prepare``, given a connection once the endpoints and the
    history are written, changes what it wants before the worker starts
    (the endpoints' spec.delivery, say)."""
    async with fresh_database(server_dsn, "steady", durable=durable, tree=tree) as dsn:
        with tempfile.TemporaryDirectory(prefix="hooklane-steady-") as tmp:
            out = Path(tmp) / "events.json"
            publisher = start_module(
                "bench.steady",
                "publish",
                *("--dsn", dsn, "--base", base, "--endpoints", str(cfg.endpoints), "--rate", str(rate)),
                *(
                    "--seconds",
                    str(cfg.warmup + cfg.seconds + cfg.tail),
                    "--connections",
                    str(cfg.publishers),
                ),
                *("--out", str(out)),
                tree=tree,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            metrics_port = free_ports(1)[0]
            worker = None
            try:
                ready = json.loads(await asyncio.to_thread(publisher.stdout.readline))
                conn = await asyncpg.connect(dsn)
                try:
                    await write_history(conn, cfg.history, cfg.endpoints)
                    if prepare is not None:
                        await prepare(conn)
                finally:
                    await conn.close()
                worker = start_worker(
                    dsn,
                    tree=tree,
                    env=env,
                    worker_concurrency=str(cfg.concurrency),
                    metrics_port=str(metrics_port),
                    metrics_host="127.0.0.1",
                )
                await wait_workers_ready(dsn, 1)
                conn = await asyncpg.connect(dsn)
                try:
                    settings = {k: await conn.fetchval(f"SHOW {k}") for k in ("synchronous_commit", "fsync")}
                    master = psutil.Process(postgres_pids(int(await conn.fetchval("SHOW port")))[0])
                    groups = {
                        "worker": [psutil.Process(worker.pid)],
                        "postgres": [master],
                        "publisher": [psutil.Process(publisher.pid)],
                        "receiver": [psutil.Process(p) for p in receiver_pids],
                    }
                    async with aiohttp.ClientSession() as http:
                        await http.post(f"{base}/_reset")
                        start = time.time() + 0.5
                        publisher.stdin.write(f"{start!r}\n")
                        publisher.stdin.flush()
                        await sleep_until(start + cfg.warmup)
                        before = snapshot(groups, metrics_port)
                        await sleep_until(start + cfg.warmup + cfg.seconds)
                        after = snapshot(groups, metrics_port)
                        if await asyncio.to_thread(publisher.wait) != 0:
                            raise RuntimeError("the publisher failed")
                        events = json.loads(out.read_text())
                        await wait_delivered(conn, cfg.history + len(events), cfg.drain_timeout)
                        stats = await (await http.get(f"{base}/_stats")).json()
                finally:
                    await conn.close()
            finally:
                if worker is not None:
                    stop_process(worker, grace=1.0)
                stop_process(publisher, grace=1.0)
    return {
        "hooklane": ready["hooklane"],
        "postgres_settings": settings,
        **analyse(rate, before, after, events, stats),
    }


async def wait_delivered(conn: asyncpg.Connection, published: int, timeout: float) -> int:
    """Wait (after the window, so the polling costs it nothing) until every
    published event's delivery is recorded (``published`` counts the
    history's too), or give up after ``timeout``."""
    deadline = time.monotonic() + timeout
    delivered = 0
    while time.monotonic() < deadline:
        delivered = await conn.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'")
        if delivered >= published:
            break
        await asyncio.sleep(0.25)
    return delivered


# --------------------------------------------------------------------------
# Several trees, repeats, the report


def describe(tree: Path | None) -> str:
    """A tree as a label: its path and commit, '+changes' when its work tree
    differs from that commit."""
    path = tree or REPO

    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True).stdout.strip()

    changed = "+changes" if git("status", "--porcelain", "--untracked-files=no") else ""
    return f"{path} @ {git('rev-parse', '--short', 'HEAD')}{changed}"


def tracing_env(url: str) -> dict[str, str]:
    """A worker's environment for tracing every delivery, exported to ``url``."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "hooklane-worker-bench",
    }


class Variant(NamedTuple):
    """What one column of the comparison runs: a source tree, traced or not."""

    tree: Path | None
    traced: bool = False


def plan(cfg: Config, variants: list[Variant]) -> list[tuple[float, int, Variant]]:
    """(rate, repeat, variant) in running order: per rate and repeat every
    variant once, alternating which goes first, so that drift in the
    machine's load falls on all alike."""
    order = []
    for rate in cfg.rates:
        for r in range(cfg.repeat):
            for variant in variants if r % 2 == 0 else variants[::-1]:
                order.append((rate, r, variant))
    return order


FIGURES = {
    "del/s": lambda r: r["deliveries_per_s"],
    "worker ms/del": lambda r: r["cpu_ms_per_delivery"]["worker"],
    "pg ms/del": lambda r: r["cpu_ms_per_delivery"]["postgres"],
    "total ms/del": lambda r: r["cpu_ms_per_delivery"]["total"],
    "worker cores": lambda r: r["cores"]["worker"],
    "pg cores": lambda r: r["cores"]["postgres"],
    "total cores": lambda r: r["cores"]["total"],
    "rounds/s": lambda r: r["reservation_rounds_per_s"],
    "rounds/del": lambda r: r["reservation_rounds_per_delivery"],
    "p50 ms": lambda r: r["latency_ms"]["p50"],
    "p99 ms": lambda r: r["latency_ms"]["p99"],
}


def aggregate(runs: list[dict], trees: list[str]) -> list[dict]:
    """Per rate and tree: the median of each figure over the repeats, and its
    range; per rate, each tree's medians over the first tree's."""
    rows = []
    for rate in sorted({r["rate"] for r in runs}):
        medians = {}
        for label in trees:
            mine = [r for r in runs if r["rate"] == rate and r["tree"] == label]
            figures = {k: [f(r) for r in mine] for k, f in FIGURES.items()}
            medians[label] = {k: statistics.median(v) for k, v in figures.items()}
            rows.append(
                {
                    "rate": rate,
                    "tree": label,
                    "runs": len(mine),
                    "median": medians[label],
                    "range": {k: [min(v), max(v)] for k, v in figures.items()},
                    "undelivered": sum(r["published"] - r["delivered"] for r in mine),
                    "steady": all(r["steady"] for r in mine),
                }
            )
        for label in trees[1:]:
            rows.append(
                {
                    "rate": rate,
                    "tree": f"{label} / {trees[0]}",
                    "ratio": {
                        k: v / medians[trees[0]][k] if medians[trees[0]][k] else None
                        for k, v in medians[label].items()
                    },
                }
            )
    return rows


def table(rows: list[dict]) -> str:
    head = ["rate", *FIGURES, "tree"]
    lines = ["  ".join(f"{h:>13}" for h in head[:-1]) + "  tree"]
    for row in rows:
        values = row.get("median") or row["ratio"]
        cells = [
            f"{row['rate']:>13g}",
            *(f"{v:>13.3g}" if v is not None else f"{'-':>13}" for v in values.values()),
        ]
        label = row["tree"] if "median" in row else "ratio " + row["tree"]
        lines.append("  ".join(cells) + "  " + label + ("" if row.get("steady", True) else "  (NOT STEADY)"))
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.rate:
        cfg = replace(cfg, rates=tuple(args.rate))
    cfg = replace(cfg, **{k: v for k, v in (("seconds", args.seconds), ("repeat", args.repeat)) if v})
    durable = args.synchronous_commit == "on"
    variants = [Variant(args.tree), *(Variant(tree) for tree in args.compare or [])]
    if args.traced:
        variants.append(Variant(variants[-1].tree, traced=True))
    labels = {v: describe(v.tree) + (" traced" if v.traced else "") for v in variants}
    runs = []
    with (
        receiver("aiohttp") as (base, receiver_pids, _kind),
        postgres_server(args.dsn, durable=durable) as server,
    ):
        # The tests' collector: its decoding is the driver's CPU, not counted.
        async with Collector() as collector:
            for rate, repeat, variant in plan(cfg, variants):
                run: dict = {"tree": labels[variant], "repeat": repeat}
                spans_before = len(collector.spans)
                env = tracing_env(collector.url) if variant.traced else None
                run.update(await run_once(server, base, receiver_pids, cfg, rate, variant.tree, durable, env))
                run["spans_exported"] = len(collector.spans) - spans_before
                print(
                    f"{rate:g}/s {labels[variant]} #{repeat}: {run['deliveries_per_s']:.1f} del/s, "
                    f"cores worker {run['cores']['worker']:.3f} pg {run['cores']['postgres']:.3f}, "
                    f"{run['reservation_rounds_per_s']:.0f} rounds/s, p50 {run['latency_ms']['p50']} ms "
                    f"p99 {run['latency_ms']['p99']} ms, {run['published'] - run['delivered']} undelivered, "
                    f"publisher late p99 {run['publisher_late_ms']['p99']} ms, "
                    f"{run['spans_exported']} spans exported",
                    flush=True,
                )
                runs.append(run)
    rows = aggregate(runs, [labels[v] for v in variants])
    print(table(rows), flush=True)
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "synchronous_commit": args.synchronous_commit,
        "machine": machine(),
        "trees": [labels[v] for v in variants],
        "summary": rows,
        "runs": runs,
    }


def main() -> None:
    if sys.argv[1:2] == ["publish"]:
        publisher_main(sys.argv[2:])
        return
    parser = argparse.ArgumentParser(description="CPU per delivery at a steady publish rate")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    parser.add_argument(
        "--rate", type=float, action="append", help="events/s (repeatable), overriding the preset"
    )
    parser.add_argument("--seconds", type=float, help="the measured window, overriding the preset")
    parser.add_argument("--repeat", type=int, help="runs per rate and tree, overriding the preset")
    parser.add_argument(
        "--synchronous-commit",
        choices=("on", "off"),
        default="off",
        help="'on': the benchmark databases commit with it on and, without --dsn, the server runs with fsync",
    )
    parser.add_argument(
        "--tree", type=Path, help="run worker, publisher and migrations from this source tree"
    )
    parser.add_argument(
        "--compare",
        type=Path,
        action="append",
        help="another source tree, run interleaved with the first (repeatable)",
    )
    parser.add_argument(
        "--traced", action="store_true", help="also run the last tree with tracing on, exporting every span"
    )
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args, lambda result: {k: v for k, v in result.items() if k != "runs"})


if __name__ == "__main__":
    main()

"""Ordered delivery per key (issue 42): what it costs beside unordered.

One endpoint, events published at a fixed rate (open loop, as
bench/steady.py: each at its scheduled time, in a transaction of its own,
by a publisher process of its own) through ``hooklane.publish`` with an
``ordering_key``, or without one. Side by
side in one run, per endpoint setting (maxConcurrency, and how long the
receiver takes to answer): the same load **unordered**, and **ordered**
over 1, 10 and 1,000 keys (event n gets key n mod keys: round robin), in
alternating order so that drift in the machine's load falls on all alike.

The receiver (``python -m bench.ordering receive``, a process of its own)
answers 204 after the path's delay and keeps, for each call, its arrival,
the event's number (``data.n``) and the ``hooklane-ordering-key`` and
``hooklane-ordering-sequence`` headers, and counts the calls open per key.

After a warm-up, over a fixed window: deliveries/s at the receiver;
publish-to-receiver latency (commit returned to the publisher, to first
arrival) of the events committed in the window; CPU seconds per delivery
of the worker process and of PostgreSQL (every process of the server, from
/proc: bench/steady.py's sampler), split into the publisher's backends
(the publish's share, pids it reports) and the rest (the delivery's share:
the worker's backends, autovacuum, the checkpointer). Then it waits (at
most ``drain_timeout``) for the backlog to reach the receiver, and checks
every key's sequence as the receiver saw it: a number lower than one
already seen is a violation, the same number again a repeat (at least
once), a number more than one above the last a gap.

One key allows one delivery in flight: its throughput is bound by one
delivery's turnaround (the receiver's answer, then the worker records it,
makes the next due and sends it), whatever the rate. ``turnaround_ms``
is that hop, measured where the key had its next event waiting: arrival
of sequence s+1 minus arrival of s.

Run: ``python -m bench.ordering --preset full`` (full | quick | smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
import asyncpg
import psutil
from aiohttp import web

import hooklane
from bench.common import (
    bench_parser,
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
from bench.steady import describe, sleep_until, snapshot, wait_delivered, window_cost, write_history
from bench.throughput import postgres_pids

EVENT_TYPE = "order.updated"
TENANT = "t0"  # create_endpoints puts endpoint 0 in tenant t0
KEY_HEADER = "hooklane-ordering-key"
SEQ_HEADER = "hooklane-ordering-sequence"
STEADY_SHARE = 0.95  # of the scheduled deliveries that must arrive within the window


@dataclass(frozen=True)
class Config:
    keys: tuple[int, ...]  # ordering keys of each ordered variant (unordered runs too)
    max_concurrency: tuple[int, ...]  # the endpoint's maxConcurrency, one setting each
    delays_ms: tuple[int, ...]  # the receiver's answer time, one setting each
    rate: float = 100  # events/s
    seconds: float = 15  # the measured window
    warmup: float = 3  # seconds of publishing before the window opens
    tail: float = 1  # seconds of publishing after it closes
    drain_timeout: float = 15  # after publishing, for the backlog to arrive
    publishers: int = 4  # publishing connections
    # Delivered events in the tables before the worker starts, then ANALYZE
    # (bench/steady.py's write_history: plans made on empty tables scan them).
    history: int = 20_000


PRESETS = {
    "full": Config(
        keys=(1, 10, 1000), max_concurrency=(4, 16), delays_ms=(0, 20), seconds=12, drain_timeout=10
    ),
    "quick": Config(keys=(1, 10, 1000), max_concurrency=(4,), delays_ms=(0,), seconds=10),
    "smoke": Config(
        keys=(1, 10),
        max_concurrency=(4,),
        delays_ms=(20,),
        rate=20,
        seconds=3,
        warmup=1,
        drain_timeout=10,
        publishers=2,
        history=1_000,
    ),
}


def key_of(n: int, keys: int) -> str | None:
    """Event n's ordering key: round robin over ``keys`` (0: unordered)."""
    return f"k{n % keys}" if keys else None


# --------------------------------------------------------------------------
# The receiver (its own process)


class Receiver:
    """Answers 204 after the path's delay (``/d/<ms>``); keeps every call's
    arrival, event number, ordering key and sequence, and the calls open
    per key (their peak) and in all (sampled)."""

    def __init__(self) -> None:
        self.open: dict[str | None, int] = defaultdict(int)
        self.epoch = 0
        self._reset()

    def _reset(self) -> None:
        # [arrival, data.n, key, sequence]: the driver analyses them.
        self.calls: list[tuple[float, int | None, str | None, int | None]] = []
        self.key_peak = 0
        self.open_samples: list[int] = []

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        try:
            n = json.loads(body)["data"]["n"]
        except (ValueError, KeyError, TypeError):
            n = None
        key = request.headers.get(KEY_HEADER)
        seq = request.headers.get(SEQ_HEADER)
        self.calls.append((now, n, key, int(seq) if seq is not None else None))
        epoch = self.epoch
        self.open[key] += 1
        if key is not None:
            self.key_peak = max(self.key_peak, self.open[key])
        try:
            delay = int(request.match_info["ms"]) / 1000
            if delay:
                await asyncio.sleep(delay)
        finally:
            if epoch == self.epoch:
                self.open[key] -= 1
        return web.Response(status=204)

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {"calls": self.calls, "key_peak_open": self.key_peak, "open_samples": self.open_samples}
        )

    async def reset(self, _request: web.Request) -> web.Response:
        self.epoch += 1
        self.open = defaultdict(int)
        self._reset()
        return web.json_response({"epoch": self.epoch})

    async def sample(self, every: float) -> None:
        while True:
            self.open_samples.append(sum(self.open.values()))
            await asyncio.sleep(every)


async def serve(port: int) -> None:
    receiver = Receiver()
    app = web.Application()
    app.router.add_get("/_stats", receiver.stats)
    app.router.add_post("/_reset", receiver.reset)
    app.router.add_post("/d/{ms:[0-9]+}", receiver.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    sampler = asyncio.create_task(receiver.sample(0.01))
    print("receiver ready", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        sampler.cancel()
        await runner.cleanup()


@contextlib.contextmanager
def receiver_process():
    """(base URL, pid) of a receiver for the whole benchmark."""
    port = free_ports(1)[0]
    proc = start_module("bench.ordering", "receive", "--port", str(port), stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # "receiver ready"
        yield f"http://127.0.0.1:{port}", proc.pid
    finally:
        stop_process(proc)


# --------------------------------------------------------------------------
# The publisher (its own process)


async def publish_one(pool: asyncpg.Pool, n: int, keys: int) -> tuple[float, float]:
    """(transaction start, commit returned), wall clock."""
    async with pool.acquire() as conn:
        started = time.time()
        async with conn.transaction():
            await hooklane.publish(
                conn,
                tenant=TENANT,
                type=EVENT_TYPE,
                data={"t": started, "n": n},
                ordering_key=key_of(n, keys),
            )
        return started, time.time()


async def publisher_async(args: argparse.Namespace) -> list[list[float]]:
    """Say ready (which hooklane, and the backends of its connections), wait
    for the start time on stdin, publish on schedule; returns every event's
    [number, due, transaction start, commit returned]."""
    pool = await asyncpg.create_pool(args.dsn, min_size=args.connections, max_size=args.connections)
    try:
        conns = [await pool.acquire() for _ in range(args.connections)]
        backends = [await c.fetchval("SELECT pg_backend_pid()") for c in conns]
        for c in conns:
            await pool.release(c)
        print(json.dumps({"hooklane": hooklane.__file__, "backends": backends}), flush=True)
        start = float(await asyncio.to_thread(sys.stdin.readline))
        mono_start = time.monotonic() + (start - time.time())
        tasks = []
        for n in range(int(args.rate * args.seconds)):
            delay = mono_start + n / args.rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(publish_one(pool, n, args.keys)))
        times = await asyncio.gather(*tasks)
    finally:
        await pool.close()
    return [[n, start + n / args.rate, s, c] for n, (s, c) in enumerate(times)]


def publisher_main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="bench.ordering publish")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--rate", type=float, required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--keys", type=int, required=True)
    parser.add_argument("--connections", type=int, required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    Path(args.out).write_text(json.dumps(asyncio.run(publisher_async(args))))


# --------------------------------------------------------------------------
# Analysis (pure)


def check_order(calls: list[list]) -> dict:
    """Every key's sequence in the order the receiver saw its calls: a
    number below one already seen is a violation, the same as the highest
    seen a repeat (at least once), one more than a step above it a gap."""
    highest: dict[str, int] = {}
    violations = repeats = gaps = unsequenced = 0
    for _at, _n, key, seq in calls:
        if key is None or seq is None:
            unsequenced += key is not None or seq is not None
            continue
        last = highest.get(key, 0)
        if seq < last:
            violations += 1
        elif seq == last:
            repeats += 1
        elif seq > last + 1:
            gaps += 1
        highest[key] = max(last, seq)
    return {
        "keys_seen": len(highest),
        "sequenced_calls": sum(1 for c in calls if c[3] is not None),
        "half_headers": unsequenced,
        "violations": violations,
        "repeats": repeats,
        "gaps": gaps,
    }


def turnarounds(calls: list[list], committed: dict[int, float]) -> list[float]:
    """Seconds from the arrival of a key's sequence s to that of s+1, where
    s+1 was committed before s arrived (it was waiting for s): one
    delivery's turnaround under one in flight per key."""
    first: dict[tuple[str, int], tuple[float, int]] = {}
    for at, n, key, seq in calls:
        if key is not None and seq is not None and n is not None:
            first.setdefault((key, seq), (at, n))
    hops = []
    for (key, seq), (at, _n) in first.items():
        nxt = first.get((key, seq + 1))
        if nxt is not None and committed.get(nxt[1], float("inf")) < at:
            hops.append(nxt[0] - at)
    return hops


def analyse(
    cfg: Config, keys: int, before: dict, after: dict, events: list[list[float]], stats: dict
) -> dict:
    """The window's figures, from two snapshots, the publisher's times and
    the receiver's calls."""
    opened, closed = before["at"], after["at"]
    wall = closed - opened
    calls = stats["calls"]
    arrived: dict[int, float] = {}
    for at, n, _key, _seq in calls:
        if n is not None:
            arrived.setdefault(n, at)
    committed = {int(n): c for n, _due, _s, c in events}
    in_window = sum(1 for at, *_ in calls if opened <= at < closed)
    published_in_window = sum(1 for c in committed.values() if opened <= c < closed)
    cost = window_cost(before, after, in_window)
    publishing = cost["cpu_seconds"]["pg_publishing"]
    delivering = cost["cpu_seconds"]["postgres"] - publishing
    samples = stats["open_samples"]
    hops = turnarounds(calls, committed)
    return {
        "keys": keys,
        "steady": in_window >= STEADY_SHARE * cfg.rate * wall,
        "published": len(events),
        "published_in_window": published_in_window,
        "calls": len(calls),
        "delivered": len(arrived),
        **cost,
        "pg_publishing_ms_per_event": 1000 * publishing / published_in_window
        if published_in_window
        else None,
        "pg_other_ms_per_delivery": 1000 * delivering / in_window if in_window else None,
        "latency_ms": _ms(
            summary([arrived[n] - c for n, c in committed.items() if opened <= c < closed and n in arrived])
        ),
        "publish_transaction_ms": _ms(summary([c - s for _n, _due, s, c in events])),
        "publisher_late_ms": _ms(summary([max(0.0, s - due) for _n, due, s, _c in events])),
        "receiver_open_mean": sum(samples) / len(samples) if samples else 0.0,
        "receiver_key_peak_open": stats["key_peak_open"],
        "turnaround_ms": _ms(summary(hops)),
        # Hops of a second or more: the key waited for something other than
        # the call before it (a timer, a periodic pass).
        "turnarounds_over_1s": sum(1 for h in hops if h >= 1.0),
        "turnaround_seconds_over_1s": round(sum(h for h in hops if h >= 1.0), 3),
        "order": check_order(calls),
    }


def _ms(s: dict[str, float]) -> dict[str, float]:
    return {k: (v if k == "n" else round(v * 1000, 2)) for k, v in s.items()}


# --------------------------------------------------------------------------
# One run

# The run's deliveries (not the history's) by state, at the end.
STATES = """
SELECT d.state, count(*) AS n FROM deliveries d
WHERE d.event_id NOT LIKE 'history-%' GROUP BY d.state
"""


async def run_once(
    server_dsn: str, base: str, cfg: Config, max_concurrency: int, delay_ms: int, keys: int
) -> dict:
    """One measured run: a database of its own with one endpoint, a worker
    (its defaults), the publisher publishing over ``keys`` keys (0:
    unordered)."""
    async with fresh_database(server_dsn, "ordering") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await create_endpoints(conn, [f"{base}/d/{delay_ms}"], max_concurrency=max_concurrency)
            await write_history(conn, cfg.history, 1)
        finally:
            await conn.close()
        with tempfile.TemporaryDirectory(prefix="hooklane-ordering-") as tmp:
            out = Path(tmp) / "events.json"
            publisher = start_module(
                "bench.ordering",
                "publish",
                *("--dsn", dsn, "--rate", str(cfg.rate), "--keys", str(keys)),
                *("--seconds", str(cfg.warmup + cfg.seconds + cfg.tail)),
                *("--connections", str(cfg.publishers), "--out", str(out)),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            metrics_port = free_ports(1)[0]
            worker = None
            try:
                ready = json.loads(await asyncio.to_thread(publisher.stdout.readline))
                worker = start_worker(dsn, metrics_port=str(metrics_port), metrics_host="127.0.0.1")
                await wait_workers_ready(dsn, 1)
                conn = await asyncpg.connect(dsn)
                try:
                    master = psutil.Process(postgres_pids(int(await conn.fetchval("SHOW port")))[0])
                    groups = {
                        "worker": [psutil.Process(worker.pid)],
                        "postgres": [master],
                        "pg_publishing": [psutil.Process(pid) for pid in ready["backends"]],
                    }
                    load = [os.getloadavg()[0]]
                    async with aiohttp.ClientSession() as http:
                        await http.post(f"{base}/_reset")
                        start = time.time() + 0.5
                        publisher.stdin.write(f"{start!r}\n")
                        publisher.stdin.flush()
                        await sleep_until(start + cfg.warmup)
                        before = snapshot(groups, alive(worker, metrics_port))
                        await sleep_until(start + cfg.warmup + cfg.seconds)
                        after = snapshot(groups, alive(worker, metrics_port))
                        load.append(os.getloadavg()[0])
                        if await asyncio.to_thread(publisher.wait) != 0:
                            raise RuntimeError("the publisher failed")
                        events = json.loads(out.read_text())
                        await wait_delivered(conn, cfg.history + len(events), cfg.drain_timeout)
                        states = {r["state"]: r["n"] for r in await conn.fetch(STATES)}
                        stats = await (await http.get(f"{base}/_stats")).json()
                finally:
                    await conn.close()
            finally:
                if worker is not None:
                    stop_process(worker, grace=1.0)
                stop_process(publisher, grace=1.0)
    return {
        "max_concurrency": max_concurrency,
        "delay_ms": delay_ms,
        "hooklane": ready["hooklane"],
        "load_average_1m": load,
        "unfinished_at_end": states.get("pending", 0) + states.get("sending", 0),
        "states_at_end": states,
        **analyse(cfg, keys, before, after, events, stats),
    }


def alive(worker: subprocess.Popen, metrics_port: int) -> int:
    """The worker's metrics port, once it is known to be still running: a
    worker that died says so, rather than its metrics refusing a scrape."""
    if worker.poll() is not None:
        raise RuntimeError(f"the worker exited (code {worker.returncode}) during the run: see its log above")
    return metrics_port


# --------------------------------------------------------------------------
# The plan, the report


def label(keys: int) -> str:
    return "unordered" if not keys else f"{keys:,} key" + ("s" if keys > 1 else "")


def plan(cfg: Config) -> list[tuple[int, int, int]]:
    """(maxConcurrency, delay, keys) in running order: per setting the
    unordered run and each ordered one, alternating which goes first."""
    order = []
    settings = [(mc, d) for mc in cfg.max_concurrency for d in cfg.delays_ms]
    for i, (mc, d) in enumerate(settings):
        variants = [0, *cfg.keys]
        for keys in variants if i % 2 == 0 else variants[::-1]:
            order.append((mc, d, keys))
    return order


FIGURES = {
    "del/s": lambda r: r["deliveries_per_s"],
    "p50 ms": lambda r: r["latency_ms"]["p50"],
    "p99 ms": lambda r: r["latency_ms"]["p99"],
    "worker ms/del": lambda r: r["cpu_ms_per_delivery"]["worker"],
    "pg ms/del": lambda r: r["cpu_ms_per_delivery"]["postgres"],
    "pg publish ms/ev": lambda r: r["pg_publishing_ms_per_event"],
    "pg other ms/del": lambda r: r["pg_other_ms_per_delivery"],
    "open mean": lambda r: r["receiver_open_mean"],
    "key peak open": lambda r: r["receiver_key_peak_open"],
    "turnaround p50 ms": lambda r: r["turnaround_ms"]["p50"],
    "turnaround p99 ms": lambda r: r["turnaround_ms"]["p99"],
    "hops ≥ 1 s": lambda r: r["turnarounds_over_1s"],
    "unfinished": lambda r: r["unfinished_at_end"],
    "order violations": lambda r: r["order"]["violations"],
}
RATIOS = ("del/s", "p99 ms", "worker ms/del", "pg ms/del", "pg other ms/del")


def summarise(runs: list[dict]) -> list[dict]:
    """One row per run, in setting order, unordered first, with each
    ordered run's ratios over the unordered one of its setting."""
    rows = []
    for r in sorted(runs, key=lambda r: (r["max_concurrency"], r["delay_ms"], r["keys"])):
        figures = {k: f(r) for k, f in FIGURES.items()}
        row = {
            "max_concurrency": r["max_concurrency"],
            "delay_ms": r["delay_ms"],
            "variant": label(r["keys"]),
            **figures,
            "steady": r["steady"],
        }
        if r["keys"]:
            [base] = [
                u
                for u in runs
                if not u["keys"]
                and (u["max_concurrency"], u["delay_ms"]) == (r["max_concurrency"], r["delay_ms"])
            ]
            row["over_unordered"] = {
                k: figures[k] / FIGURES[k](base) if FIGURES[k](base) else None for k in RATIOS
            }
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    """The rows as a Markdown table (docs/benchmarks.md takes it as is)."""
    head = ["maxConcurrency", "receiver", "variant", *FIGURES]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for row in rows:
        cells = [str(row["max_concurrency"]), f"{row['delay_ms']} ms", row["variant"]]
        for k in FIGURES:
            v = row[k]
            cells.append("-" if v is None else f"{v:.3g}" if isinstance(v, float) else str(v))
        lines.append("| " + " | ".join(cells) + " |" + ("" if row["steady"] else " (not steady)"))
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    overrides = {
        "keys": tuple(args.keys) if args.keys else None,
        "max_concurrency": tuple(args.max_concurrency) if args.max_concurrency else None,
        "delays_ms": tuple(args.delay_ms) if args.delay_ms is not None else None,
        "seconds": args.seconds,
    }
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    runs = []
    load = [os.getloadavg()]
    with receiver_process() as (base, _pid), postgres_server(args.dsn) as server:
        for mc, delay_ms, keys in plan(cfg):
            run = await run_once(server, base, cfg, mc, delay_ms, keys)
            print(
                f"maxConcurrency {mc}, receiver {delay_ms} ms, {label(keys)}: "
                f"{run['deliveries_per_s']:.1f} del/s, p50 {run['latency_ms']['p50']} ms "
                f"p99 {run['latency_ms']['p99']} ms, ms/del worker {run['cpu_ms_per_delivery']['worker']:.3f} "
                f"pg {run['cpu_ms_per_delivery']['postgres']:.3f}, open mean {run['receiver_open_mean']:.2f} "
                f"key peak {run['receiver_key_peak_open']}, turnaround {run['turnaround_ms']}, "
                f"{run['turnarounds_over_1s']} hops >= 1 s, "
                f"{run['unfinished_at_end']} unfinished, order {run['order']}, load {run['load_average_1m']}",
                flush=True,
            )
            runs.append(run)
    load.append(os.getloadavg())
    rows = summarise(runs)
    print(table(rows), flush=True)
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "load_average": load,
        "tree": describe(None),
        "summary": rows,
        "table": table(rows),
        "runs": runs,
    }


def main() -> None:
    if sys.argv[1:2] == ["publish"]:
        publisher_main(sys.argv[2:])
        return
    if sys.argv[1:2] == ["receive"]:
        parser = argparse.ArgumentParser(prog="bench.ordering receive")
        parser.add_argument("--port", type=int, required=True)
        with contextlib.suppress(KeyboardInterrupt):
            asyncio.run(serve(parser.parse_args(sys.argv[2:]).port))
        return
    parser = bench_parser("ordered delivery per key against unordered, one endpoint", PRESETS)
    parser.add_argument("--keys", type=int, action="append", help="keys of an ordered run (repeatable)")
    parser.add_argument(
        "--max-concurrency", type=int, action="append", help="the endpoint's maxConcurrency (repeatable)"
    )
    parser.add_argument(
        "--delay-ms", type=int, action="append", help="the receiver's answer time in ms (repeatable)"
    )
    parser.add_argument("--seconds", type=float, help="the measured window, overriding the preset")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    for name in ("keys", "max_concurrency", "delay_ms"):
        values = getattr(args, name) or []
        if any(v < (0 if name == "delay_ms" else 1) for v in values):
            parser.error(
                f"--{name.replace('_', '-')} must be {'0 or more' if name == 'delay_ms' else 'positive'}"
            )
    if args.seconds is not None and not args.seconds > 0:
        parser.error("--seconds must be positive")
    run_and_report(main_async, args, lambda result: {k: v for k, v in result.items() if k != "runs"})


if __name__ == "__main__":
    main()

"""The incident of seed 000, side by side: Hooklane against the naive FIFO.

Many endpoints answer at once; one answers after ``--slow-delay`` seconds
(28 s in the seed) and gets 12 events/s of a steady publish rate. The same
load runs against ``hooklane worker`` and against bench/baseline.py (one FIFO
table, SKIP LOCKED batches, no per-endpoint limit), with the same number of
in-flight slots, one after the other, for each slot count asked for (the
seed's 16, then Hooklane's default 64).

Everything is measured at the receivers: the lag of each healthy delivery
(arrival minus the publish time carried in ``data.t``), the slow endpoint's
calls in flight, deliveries per second. Healthy events still undelivered
when a run ends are counted from the database, since a lag that never ended
cannot be seen at a receiver.

Run: ``python -m bench.incident --preset quick`` (full | quick | smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
import asyncpg

import hooklane
from bench import baseline
from bench.common import (
    DOCS,
    SECRET,
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
from hooklane.settings import Settings

SLOW = 0  # the index of the slow endpoint; every other one is healthy
EVENT_TYPE = "order.updated"


@dataclass(frozen=True)
class Config:
    endpoints: int
    rate: float  # events/s in all
    slow_rate: float  # events/s of it to the slow endpoint
    slow_delay: float  # seconds the slow endpoint takes to answer
    duration: float  # seconds of publishing
    grace: float  # seconds after publishing stops before measuring ends
    slots: tuple[int, ...]  # in-flight slots per worker process, one run each
    receivers: int  # receiver processes
    max_concurrency: int = 4  # the slow endpoint's limit (the contract default)
    # The slow endpoint's whole-call deadline. Above the delay, so that its
    # calls succeed after holding a slot for the whole delay, as in the seed:
    # the hardest case for isolation (a 5 s deadline would free slots sooner).
    slow_timeout: int = 60
    publishers: int = 4  # concurrent publishing connections


# The seed's 16 slots, then a worker's default.
DEFAULT_SLOTS = Settings().worker_concurrency

PRESETS = {
    "full": Config(
        endpoints=1800,
        rate=100,
        slow_rate=12,
        slow_delay=28,
        duration=120,
        grace=5,
        slots=(16, DEFAULT_SLOTS),
        receivers=2,
    ),
    "quick": Config(
        endpoints=300,
        rate=60,
        slow_rate=12,
        slow_delay=8,
        duration=45,
        grace=3,
        slots=(16, DEFAULT_SLOTS),
        receivers=1,
    ),
    "smoke": Config(
        endpoints=20, rate=30, slow_rate=6, slow_delay=1, duration=3, grace=1, slots=(16,), receivers=1
    ),
}


# --------------------------------------------------------------------------
# Load


def schedule(cfg: Config) -> list[tuple[float, int]]:
    """(offset in seconds, endpoint index) of every event, evenly paced: the
    slow endpoint at ``slow_rate``, the rest round-robin over the healthy."""
    events = [(n / cfg.slow_rate, SLOW) for n in range(int(cfg.duration * cfg.slow_rate))]
    healthy_rate = cfg.rate - cfg.slow_rate
    for n in range(int(cfg.duration * healthy_rate)):
        events.append((n / healthy_rate, 1 + n % (cfg.endpoints - 1)))
    return sorted(events)


async def publish_hooklane(conn: asyncpg.Connection, endpoint: int, n: int) -> None:
    async with conn.transaction():
        await hooklane.publish(conn, tenant=f"t{endpoint}", type=EVENT_TYPE, data={"t": time.time(), "n": n})


async def publish_baseline(conn: asyncpg.Connection, endpoint: int, n: int) -> None:
    await baseline.publish(conn, endpoint, "msg_" + uuid.uuid4().hex, EVENT_TYPE, {"t": time.time(), "n": n})


async def publish_load(dsn: str, system: str, cfg: Config, events: list[tuple[float, int]]) -> float:
    """Publish on schedule from a few connections; returns how far behind
    schedule the publisher fell at worst (seconds), to show it kept up."""
    publish = publish_hooklane if system == "hooklane" else publish_baseline
    start = time.time()
    queue: asyncio.Queue[tuple[int, float, int]] = asyncio.Queue()
    for n, (offset, endpoint) in enumerate(events):
        queue.put_nowait((n, offset, endpoint))
    behind = 0.0

    async def run() -> None:
        nonlocal behind
        conn = await asyncpg.connect(dsn)
        try:
            while not queue.empty():
                n, offset, endpoint = queue.get_nowait()
                wait = start + offset - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                else:
                    behind = max(behind, -wait)
                await publish(conn, endpoint, n)
        finally:
            await conn.close()

    await asyncio.gather(*(run() for _ in range(cfg.publishers)))
    return behind


# --------------------------------------------------------------------------
# One run


async def setup_hooklane(dsn: str, urls: list[str], cfg: Config, slots: int):
    conn = await asyncpg.connect(dsn)
    try:
        await create_endpoints(conn, urls, slow={SLOW: (cfg.max_concurrency, cfg.slow_timeout)})
    finally:
        await conn.close()
    worker = start_worker(dsn, worker_concurrency=str(slots))
    await wait_workers_ready(dsn, 1)
    return worker


async def setup_baseline(dsn: str, urls: list[str], cfg: Config, slots: int):
    conn = await asyncpg.connect(dsn)
    try:
        timeouts = [cfg.slow_timeout if i == SLOW else 5 for i in range(len(urls))]
        await baseline.install(
            conn, [(i, u, t) for i, (u, t) in enumerate(zip(urls, timeouts, strict=False))], SECRET
        )
    finally:
        await conn.close()
    worker = start_module("bench.baseline", "--dsn", dsn, "--slots", str(slots))
    await asyncio.sleep(1.0)  # its imports and pool; it polls from then on
    return worker


# The slow endpoint's deliveries in flight as the database sees them: a cross
# check of the receiver's count (reserved versus actually on the wire).
SLOW_SENDING = {
    "hooklane": "SELECT count(*) FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id"
    " WHERE ep.name = 'ep-0' AND d.state = 'sending'",
    "baseline": "SELECT count(*) FROM baseline_deliveries WHERE endpoint_id = 0 AND status = 'sending'",
}


async def sample_db_in_flight(dsn: str, system: str, stop: asyncio.Event) -> int:
    """Peak of SLOW_SENDING, sampled every 0.2 s until ``stop``."""
    conn = await asyncpg.connect(dsn)
    peak = 0
    try:
        while not stop.is_set():
            peak = max(peak, await conn.fetchval(SLOW_SENDING[system]))
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    finally:
        await conn.close()
    return peak


BACKLOG = {
    "hooklane": """
        SELECT count(*) FILTER (WHERE ep.name = 'ep-0') AS slow_pending,
               count(*) FILTER (WHERE ep.name <> 'ep-0') AS healthy_pending,
               extract(epoch FROM now() - min(d.created_at) FILTER (WHERE ep.name <> 'ep-0'))
                 AS healthy_oldest_age
        FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
        WHERE d.state IN ('pending', 'sending')""",
    "baseline": """
        SELECT count(*) FILTER (WHERE endpoint_id = 0) AS slow_pending,
               count(*) FILTER (WHERE endpoint_id <> 0) AS healthy_pending,
               extract(epoch FROM now() - min(created_at) FILTER (WHERE endpoint_id <> 0))
                 AS healthy_oldest_age
        FROM baseline_deliveries WHERE status IN ('pending', 'sending')""",
}


async def run_once(server_dsn: str, system: str, slots: int, cfg: Config, receivers: list[str]) -> dict:
    urls = [
        f"{receivers[i % len(receivers)]}/{'slow' if i == SLOW else 'h'}/{i}" for i in range(cfg.endpoints)
    ]
    async with fresh_database(server_dsn, f"incident_{system}") as dsn:
        setup = setup_hooklane if system == "hooklane" else setup_baseline
        worker = await setup(dsn, urls, cfg, slots)
        try:
            async with aiohttp.ClientSession() as http:
                for r in receivers:
                    await http.post(f"{r}/_reset")
                started = time.time()
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_db_in_flight(dsn, system, stop))
                behind = await publish_load(dsn, system, cfg, schedule(cfg))
                await asyncio.sleep(cfg.grace)
                stop.set()
                db_peak = await sampler
                ended = time.time()
                stats = [await (await http.get(f"{r}/_stats")).json() for r in receivers]
            conn = await asyncpg.connect(dsn)
            try:
                backlog = dict(await conn.fetchrow(BACKLOG[system]))
            finally:
                await conn.close()
        finally:
            stop_process(worker, grace=1.0)
    return {
        **analyse(system, slots, cfg, started, ended, behind, stats, backlog),
        "slow_peak_sending_in_db": db_peak,
    }


def analyse(
    system: str,
    slots: int,
    cfg: Config,
    started: float,
    ended: float,
    behind: float,
    stats: list[dict],
    backlog: dict,
) -> dict:
    arrivals = sorted(a for s in stats for a in s["arrivals"])
    healthy = [(t - started, lag) for t, lag, slow in arrivals if not slow and not math.isnan(lag)]
    per_second: dict[int, list[float]] = defaultdict(list)
    delivered_per_second: dict[int, int] = defaultdict(int)
    for t, _lag, _slow in arrivals:
        delivered_per_second[int(t - started)] += 1
    for t, lag in healthy:
        per_second[int(t)].append(lag)
    seconds = range(int(ended - started) + 1)
    series = {
        "second": list(seconds),
        "healthy_p50": [summary(per_second[s])["p50"] for s in seconds],
        "healthy_p99": [summary(per_second[s])["p99"] for s in seconds],
        "healthy_max": [summary(per_second[s])["max"] for s in seconds],
        "deliveries": [delivered_per_second[s] for s in seconds],
    }
    in_flight = [(t - started, n) for s in stats[:1] for t, n in s["slow_in_flight"] if t >= started]
    p99s = [v for v in series["healthy_p99"] if not math.isnan(v)]
    return {
        "system": system,
        "slots": slots,
        "published": int(cfg.duration * cfg.rate),
        "publisher_behind_max_s": round(behind, 3),
        "healthy_lag": summary([lag for _, lag in healthy]),
        "healthy_worst_second_p99": max(p99s) if p99s else float("nan"),
        "healthy_delivered": len(healthy),
        "slow_delivered": sum(1 for a in arrivals if a[2]),
        "slow_peak_in_flight": stats[0]["slow_peak"],
        "deliveries_per_s": len(arrivals) / (ended - started),
        "backlog_at_end": backlog,
        "series": series,
        "slow_in_flight": in_flight,
    }


# --------------------------------------------------------------------------
# Report


def plot(results: list[dict], cfg: Config, slots: int, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"hooklane": "tab:blue", "baseline": "tab:red"}
    fig, (lag_ax, slow_ax, rate_ax) = plt.subplots(3, 1, figsize=(9, 9), sharex=True)
    for r in results:
        s, c = r["series"], colours[r["system"]]
        lag_ax.plot(s["second"], s["healthy_p99"], color=c, label=f"{r['system']} p99")
        lag_ax.plot(s["second"], s["healthy_max"], color=c, linestyle=":", label=f"{r['system']} max")
        t, n = zip(*r["slow_in_flight"], strict=False) if r["slow_in_flight"] else ((), ())
        slow_ax.step(t, n, where="post", color=c, label=r["system"])
        rate_ax.plot(s["second"], s["deliveries"], color=c, label=r["system"])
    lag_ax.axhline(1.0, color="grey", linestyle="--", linewidth=0.8, label="1 s target")
    lag_ax.set_yscale("log")
    lag_ax.set_ylabel("healthy delivery lag (s)")
    lag_ax.legend(fontsize=8, ncol=3)
    slow_ax.axhline(cfg.max_concurrency, color="grey", linestyle="--", linewidth=0.8, label="maxConcurrency")
    slow_ax.set_ylabel("slow endpoint in flight")
    slow_ax.legend(fontsize=8)
    rate_ax.set_ylabel("deliveries/s (all)")
    rate_ax.set_xlabel("seconds since publishing started")
    rate_ax.legend(fontsize=8)
    fig.suptitle(
        f"{cfg.endpoints} endpoints, {cfg.rate:g} events/s, {cfg.slow_rate:g}/s to one answering in "
        f"{cfg.slow_delay:g} s; {slots} slots"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def verdict(results: list[dict], cfg: Config) -> dict:
    by = {(r["system"], r["slots"]): r for r in results}
    out = {}
    for slots in cfg.slots:
        h, b = by[("hooklane", slots)], by[("baseline", slots)]
        out[str(slots)] = {
            "hooklane_p99": h["healthy_lag"]["p99"],
            "hooklane_worst_second_p99": h["healthy_worst_second_p99"],
            "baseline_p99": b["healthy_lag"]["p99"],
            "baseline_healthy_undelivered": b["backlog_at_end"]["healthy_pending"],
            "p99_ratio_baseline_over_hooklane": b["healthy_lag"]["p99"] / h["healthy_lag"]["p99"],
            "target_hooklane_p99_under_1s_whole_run": h["healthy_worst_second_p99"] < 1.0,
            "target_slow_within_max_concurrency": h["slow_peak_in_flight"] <= cfg.max_concurrency,
        }
    return out


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(
        cfg, **{k: v for k, v in (("duration", args.duration), ("slow_delay", args.slow_delay)) if v}
    )
    if args.slots:
        cfg = replace(cfg, slots=tuple(args.slots))
    ports = free_ports(cfg.receivers)
    procs = [
        start_module("bench.receiver", "--port", str(p), "--slow-delay", str(cfg.slow_delay)) for p in ports
    ]
    receivers = [f"http://127.0.0.1:{p}" for p in ports]
    results = []
    try:
        await wait_http(receivers)
        with postgres_server(args.dsn) as server:
            for slots in cfg.slots:
                for system in ("hooklane", "baseline"):
                    r = await run_once(server, system, slots, cfg, receivers)
                    print(
                        f"{system:9s} slots={slots:3d} healthy p50={r['healthy_lag']['p50']:.3f}s "
                        f"p99={r['healthy_lag']['p99']:.3f}s max={r['healthy_lag']['max']:.3f}s "
                        f"slow peak={r['slow_peak_in_flight']} (db {r['slow_peak_sending_in_db']}) backlog={r['backlog_at_end']}",
                        flush=True,
                    )
                    results.append(r)
                if args.plot_dir:
                    plot(
                        [r for r in results if r["slots"] == slots],
                        cfg,
                        slots,
                        Path(args.plot_dir) / f"incident-{args.preset}-{slots}.png",
                    )
    finally:
        for p in procs:
            stop_process(p)
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "verdict": verdict(results, cfg),
        "runs": results,
    }


async def wait_http(urls: list[str], timeout: float = 20.0) -> None:
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


def main() -> None:
    parser = argparse.ArgumentParser(description="seed 000's incident: Hooklane vs the naive FIFO")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    parser.add_argument("--slots", type=int, action="append", help="in-flight slots (repeatable)")
    parser.add_argument("--duration", type=float, help="seconds of publishing, overriding the preset")
    parser.add_argument(
        "--slow-delay", type=float, help="the slow endpoint's answer time, overriding the preset"
    )
    parser.add_argument("--plot-dir", default=str(DOCS / "img"), help="'' for no plot")
    parser.add_argument("--json", help="write the full results here")
    args = parser.parse_args()
    run_and_report(main_async, args, _brief)


def _brief(result: dict) -> dict:
    """The result without the per-second series."""
    runs = [{k: v for k, v in r.items() if k not in ("series", "slow_in_flight")} for r in result["runs"]]
    return {**{k: v for k, v in result.items() if k != "runs"}, "runs": runs}


if __name__ == "__main__":
    main()

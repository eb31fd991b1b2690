"""Rate limits (issue 23): the starts an endpoint gets against its limit,
and what the limit costs beside today's path.

1. **Against the limit** (``limits``): one run, one endpoint per case (a
   ``spec.delivery.rateLimit`` of perSecond and burst, a maxConcurrency),
   each with a backlog it cannot finish (bulk-inserted, as bench/throughput.py
   does), drained by ``workers`` worker processes into one loopback receiver
   (bench/receiver.py) that answers 204 at once. After a warm-up, over a
   window: each endpoint's calls per second at the receiver over its limit;
   the most calls in any 1 s (sliding: every window that opens at a call)
   in the window and over the whole run, whose first second holds the burst
   an empty bucket allows, against the bound perSecond + burst - 1; the
   spacing of consecutive calls (p1 and p50 gap against 1/perSecond); the
   same most-in-1-s from the attempts' start times the workers recorded
   (delivery_attempts.started_at), to tell the limit's from the network's
   jitter; and the reservation rounds of the workers.

2. **Cost at a rate** (``cost``): the same events/s reaching one endpoint
   (maxConcurrency 4, the default), CPU seconds per delivery of the worker
   process and of PostgreSQL (bench/steady.py's sampler: every process of
   the server, exited children included), three ways, interleaved
   (bench/steady.py's plan): **(i)** no limit, published at the rate by
   bench/steady.py's publisher process (today's path); **(ii)** rateLimit
   perSecond = the rate and a backlog, drained at the limit (nothing
   published: the inserts of (i) are not in its PostgreSQL share); **(iii)**
   rateLimit = the rate and published at it, the same work as (i) with the
   bucket in the way. Medians and ratios over (i) by bench/steady.py's
   aggregate.

Run: ``python -m bench.rate_limit --preset full`` (full | quick | smoke)
"""

from __future__ import annotations

import argparse
import bisect
import itertools
from dataclasses import asdict, dataclass, replace
from functools import partial

import aiohttp
import asyncpg
import psutil

from bench import steady
from bench.common import (
    bench_parser,
    create_endpoints,
    free_ports,
    fresh_database,
    machine,
    percentile,
    postgres_server,
    run_and_report,
    start_worker,
    stop_process,
    summary,
    wait_workers_ready,
)
from bench.steady import sleep_until, snapshot, window_cost, write_history
from bench.throughput import BACKLOG_DELIVERIES, postgres_pids, receiver
from hooklane.delivery import DeliverySpec


@dataclass(frozen=True)
class Case:
    """One rate-limited endpoint of the ``limits`` run."""

    per_second: int
    burst: int = 1
    max_concurrency: int = 4  # the spec's default

    @property
    def label(self) -> str:
        return f"{self.per_second}/s burst {self.burst} maxConcurrency {self.max_concurrency}"


@dataclass(frozen=True)
class Config:
    cases: tuple[Case, ...]
    window: float  # seconds measured of the limits run
    warmup: float  # seconds of draining before its window opens
    workers: int = 2
    cost_rate: int = 100  # events/s of the cost runs
    cost_window: float = 30.0
    cost_warmup: float = 5.0
    cost_repeat: int = 3  # runs of each way
    history: int = 50_000  # delivered events in the tables before a worker starts (bench/steady.py)
    # Backlog of each endpoint: what its limit allows over the whole run, this many times over.
    backlog_margin: float = 1.3


CASES = (
    Case(1),
    Case(10),
    Case(100),
    Case(500),
    # Enough slots to take the whole second of lookahead a round may grant.
    Case(500, max_concurrency=256),
    Case(100, burst=50, max_concurrency=64),
)
PRESETS = {
    "full": Config(cases=CASES, window=60, warmup=5),
    "quick": Config(cases=CASES, window=20, warmup=3, cost_window=15, cost_warmup=3, cost_repeat=1),
    "smoke": Config(
        cases=(Case(10), Case(50, burst=5, max_concurrency=8)),
        window=2,
        warmup=0.5,
        workers=1,
        cost_rate=20,
        cost_window=2,
        cost_warmup=0.5,
        cost_repeat=1,
        history=1_000,
    ),
}

# Each endpoint's backlog: $1 its tenant, $2 how many, one delivery each
# (throughput's BACKLOG_DELIVERIES joins them to their endpoint).
BACKLOG_EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout)
SELECT 'evt_' || b.tenant || '_' || g, b.tenant, $3, jsonb_build_object('n', g), 1
FROM unnest($1::text[], $2::int[]) AS b(tenant, n), generate_series(1, b.n) AS g
"""
# The start time of every attempt of an endpoint, as its worker recorded it.
STARTS = """
SELECT array_agg(extract(epoch FROM a.started_at)::float8 ORDER BY a.started_at)
FROM delivery_attempts a JOIN endpoints ep ON ep.id = a.endpoint_id WHERE ep.tenant = $1
"""

# The buckets' index: an entry for every delivery a rate-limited endpoint
# was granted, kept as long as the delivery is.
BUCKET_INDEX = """
SELECT pg_relation_size('deliveries_rate') AS bytes,
       (SELECT count(*) FROM deliveries WHERE rate_tat IS NOT NULL) AS entries
"""


# --------------------------------------------------------------------------
# Figures (pure)


def in_each_second(times: list[float]) -> list[int]:
    """For each of the sorted ``times``, how many of them are in [t, t + 1 s)."""
    return [bisect.bisect_left(times, t + 1.0) - i for i, t in enumerate(times)]


def most_in_a_second(times: list[float]) -> int:
    """The most of the sorted ``times`` in any [t, t + 1 s) (the windows that
    open at one of them are the only ones to look at)."""
    return max(in_each_second(times), default=0)


def over_bound(times: list[float], bound: int) -> float | None:
    """The share of the 1 s windows opening at one of the sorted ``times``
    that hold more than ``bound`` of them."""
    counts = in_each_second(times)
    return sum(1 for n in counts if n > bound) / len(counts) if counts else None


def case_figures(case: Case, calls: list[float], starts: list[float], opened: float, closed: float) -> dict:
    """An endpoint's calls at the receiver and its attempts' recorded starts
    (sorted wall times), over the window [opened, closed) and the whole run."""
    window = [t for t in calls if opened <= t < closed]
    gaps = [b - a for a, b in itertools.pairwise(window)]
    spacing = 1.0 / case.per_second
    return {
        "case": asdict(case),
        "label": case.label,
        "calls_in_window": len(window),
        "achieved_per_s": len(window) / (closed - opened),
        "achieved_over_limit": len(window) / (closed - opened) / case.per_second,
        "bound_in_1s": case.per_second + case.burst - 1,
        "most_in_1s_window": most_in_a_second(window),
        "most_in_1s_run": most_in_a_second(calls),
        "first_second": bisect.bisect_left(calls, calls[0] + 1.0) if calls else 0,
        "most_in_1s_recorded_starts": most_in_a_second(starts),
        # Of the 1 s windows opening at a call of the window, those above the bound.
        "windows_over_bound_share": over_bound(window, case.per_second + case.burst - 1),
        "gap_p1_over_spacing": percentile(gaps, 1) / spacing if gaps else None,
        "gap_p50_over_spacing": percentile(gaps, 50) / spacing if gaps else None,
        "gap_min_ms": 1000 * min(gaps) if gaps else None,
        "spacing_ms": 1000 * spacing,
        # Calls in each whole second from the first one.
        "per_second": [
            bisect.bisect_left(calls, calls[0] + k + 1) - bisect.bisect_left(calls, calls[0] + k)
            for k in range(int(calls[-1] - calls[0]) + 1 if calls else 0)
        ],
    }


def calls_by_path(stats: dict) -> dict[str, list[float]]:
    """Arrival times at the receiver, sorted, by path."""
    found: dict[str, list[float]] = {}
    for (at, _lag, _kind), path in zip(stats["arrivals"], stats["paths"], strict=True):
        found.setdefault(path, []).append(at)
    return {path: sorted(times) for path, times in found.items()}


# --------------------------------------------------------------------------
# A drain at the limits


async def load(
    conn: asyncpg.Connection, base: str, cases: tuple[Case, ...], backlog: list[int], history: int
):
    """The endpoints (endpoint i at ``/h/<i>``, tenant t<i>, with case i's
    limit), each one's backlog, and bench/steady.py's history."""
    await create_endpoints(
        conn,
        [f"{base}/h/{i}" for i in range(len(cases))],
        slow={i: (c.max_concurrency, 5) for i, c in enumerate(cases)},
        delivery={i: DeliverySpec(rate_per_second=c.per_second, burst=c.burst) for i, c in enumerate(cases)},
    )
    await conn.execute(BACKLOG_EVENTS, [f"t{i}" for i in range(len(cases))], backlog, steady.EVENT_TYPE)
    await conn.execute(BACKLOG_DELIVERIES)
    await write_history(conn, history, len(cases))


async def drain_at_limits(
    server: str,
    base: str,
    receiver_pids: list[int],
    cases: tuple[Case, ...],
    cfg: Config,
    *,
    workers: int,
    warmup: float,
    window: float,
) -> dict:
    """One run: the cases' endpoints, each with its backlog, drained by
    ``workers`` workers; what the window cost, and each case's figures."""
    backlog = [int(cfg.backlog_margin * (c.per_second * (warmup + window + 5) + c.burst)) for c in cases]
    async with fresh_database(server, "rate_limit") as dsn:
        conn = await asyncpg.connect(dsn)
        procs: list = []
        try:
            await load(conn, base, cases, backlog, cfg.history)
            master = psutil.Process(postgres_pids(int(await conn.fetchval("SHOW port")))[0])
            async with aiohttp.ClientSession() as http:
                await http.post(f"{base}/_reset")
                ports = free_ports(workers)
                procs = [start_worker(dsn, metrics_port=str(p), metrics_host="127.0.0.1") for p in ports]
                ready = await wait_workers_ready(dsn, workers)
                groups = {
                    "worker": [psutil.Process(p.pid) for p in procs],
                    "postgres": [master],
                    "receiver": [psutil.Process(p) for p in receiver_pids],
                }
                await sleep_until(ready + warmup)
                before = snapshot(groups, *ports)
                await sleep_until(ready + warmup + window)
                after = snapshot(groups, *ports)
                stats = await (await http.get(f"{base}/_stats")).json()
            for p in procs:
                stop_process(p, grace=1.0)
            starts = [await conn.fetchval(STARTS, f"t{i}") or [] for i in range(len(cases))]
            bucket = dict(await conn.fetchrow(BUCKET_INDEX))
        finally:
            for p in procs:
                stop_process(p, grace=1.0)
            await conn.close()
    calls = calls_by_path(stats)
    figures = [
        case_figures(c, calls.get(f"/h/{i}", []), starts[i], before["at"], after["at"])
        for i, c in enumerate(cases)
    ]
    return {
        "workers": workers,
        "backlog": backlog,
        **window_cost(before, after, sum(f["calls_in_window"] for f in figures)),
        "bucket_index": bucket,
        "cases": figures,
    }


# --------------------------------------------------------------------------
# Cost at a rate, three ways

UNLIMITED = "(i) no limit, published"
LIMITED_BACKLOG = "(ii) rateLimit, backlog"
LIMITED_PUBLISHED = "(iii) rateLimit, published"
WAYS = (UNLIMITED, LIMITED_BACKLOG, LIMITED_PUBLISHED)


async def limit_endpoint(base: str, rate: int, conn: asyncpg.Connection) -> None:
    """bench/steady.py's endpoint, rate-limited: the same spec and a limit."""
    await create_endpoints(conn, [f"{base}/h/0"], delivery={0: DeliverySpec(rate_per_second=rate)})


async def cost_run(server: str, base: str, receiver_pids: list[int], cfg: Config, way: str) -> dict:
    """One cost run, in the form of bench/steady.py's (its aggregate reads it)."""
    rate = cfg.cost_rate
    if way == LIMITED_BACKLOG:
        run = await drain_at_limits(
            server,
            base,
            receiver_pids,
            (Case(rate),),
            cfg,
            workers=1,
            warmup=cfg.cost_warmup,
            window=cfg.cost_window,
        )
        made = run["deliveries_in_window"]
        # Nothing published: latency has no start, and the backlog is left over by design.
        return {
            **run,
            "rate": rate,
            "steady": made >= steady.STEADY_SHARE * rate * run["window_seconds"],
            "published": made,
            "delivered": made,
            "latency_ms": summary([]),
        }
    steady_cfg = steady.Config(
        rates=(rate,), seconds=cfg.cost_window, warmup=cfg.cost_warmup, endpoints=1, history=cfg.history
    )
    prepare = partial(limit_endpoint, base, rate) if way == LIMITED_PUBLISHED else None
    return await steady.run_once(server, base, receiver_pids, steady_cfg, rate, None, False, prepare=prepare)


# --------------------------------------------------------------------------
# Report


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.window:
        cfg = replace(cfg, window=args.window)
    if args.cost_repeat:
        cfg = replace(cfg, cost_repeat=args.cost_repeat)
    result: dict = {"preset": args.preset, "config": asdict(cfg), "machine": machine()}
    with receiver("aiohttp") as (base, receiver_pids, _kind), postgres_server(args.dsn) as server:
        if args.part in ("all", "limits"):
            limits = await drain_at_limits(
                server,
                base,
                receiver_pids,
                cfg.cases,
                cfg,
                workers=cfg.workers,
                warmup=cfg.warmup,
                window=cfg.window,
            )
            for f in limits["cases"]:
                print(
                    f"{f['label']:40s} {f['achieved_per_s']:8.2f}/s ({f['achieved_over_limit']:.3f} of the"
                    f" limit), most in 1 s {f['most_in_1s_window']} (run {f['most_in_1s_run']}, recorded"
                    f" {f['most_in_1s_recorded_starts']}, bound {f['bound_in_1s']}), p1 gap"
                    f" {f['gap_p1_over_spacing']:.2f} x 1/limit",
                    flush=True,
                )
            result["limits"] = limits
        if args.part in ("all", "cost"):
            runs = []
            order = steady.plan(
                steady.Config(rates=(cfg.cost_rate,), seconds=0, warmup=0, repeat=cfg.cost_repeat), list(WAYS)
            )
            for _rate, repeat, way in order:
                run = {"tree": way, "repeat": repeat, **await cost_run(server, base, receiver_pids, cfg, way)}
                print(
                    f"{way:28s} #{repeat}: {run['deliveries_per_s']:.1f} del/s, ms/del worker"
                    f" {run['cpu_ms_per_delivery']['worker']:.3f} pg {run['cpu_ms_per_delivery']['postgres']:.3f},"
                    f" {run['reservation_rounds_per_delivery']:.2f} rounds/del",
                    flush=True,
                )
                runs.append(run)
            rows = steady.aggregate(runs, list(WAYS))
            print(steady.table(rows), flush=True)
            result["cost"] = {"summary": rows, "runs": runs}
    return result


def main() -> None:
    parser = bench_parser("rate limits: starts against the limit, and their cost", PRESETS)
    parser.add_argument("--part", choices=("all", "limits", "cost"), default="all")
    parser.add_argument(
        "--window", type=float, help="seconds measured of the limits run, overriding the preset"
    )
    parser.add_argument("--cost-repeat", type=int, help="runs of each cost way, overriding the preset")
    parser.add_argument("--json", help="write the full results here")
    args = parser.parse_args()
    run_and_report(main_async, args, _brief)


def _brief(result: dict) -> dict:
    """The result without the runs of the cost part."""
    out = dict(result)
    if "cost" in out:
        out["cost"] = {"summary": out["cost"]["summary"]}
    return out


if __name__ == "__main__":
    main()

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

``--adaptive`` runs Hooklane only, with one more endpoint among the healthy
(issue 23): it gets ``busy_rate`` of the events and a receiver that takes
``busy_open`` calls at once, each answered in ``busy_delay`` seconds, and
answers 429 at once to any call beyond them (more than it can take: its
queue grows in every run). Four runs: that endpoint with
adaptiveConcurrency and without (today: each 429 is a failed attempt,
retried after its backoff), each with the 429s carrying no Retry-After and
one of ``busy_retry_after`` seconds. Reported for that endpoint: its
concurrency limit in force over time (read from the database), its calls
in flight, its 429s per minute and its delivered rate; for the others,
their lag as above.

``--ordered-keys N`` runs Hooklane only, twice per slot count, side by side:
as above, and with every event carrying one of N ordering keys (issue 42;
event n gets key n mod N), so that each endpoint, the slow one included,
sends at most one delivery of a key at a time, in order. What it shows is
whether ordering costs the healthy endpoints their lag while one is slow.

``--correlated`` runs issue 39's correlated incidents instead: many
endpoints slow at once, before and after side by side (bench/correlated.py).

Run: ``python -m bench.incident --preset quick [--adaptive | --correlated | --ordered-keys N]``
(full | quick | smoke)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import json
import math
import time
import uuid
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
import asyncpg

import hooklane
from bench import baseline, correlated
from bench.common import (
    DOCS,
    SECRET,
    bench_parser,
    create_endpoints,
    fresh_database,
    machine,
    percentile,
    postgres_server,
    run_and_report,
    start_module,
    start_receivers,
    start_worker,
    stop_process,
    summary,
    wait_receivers,
    wait_workers_ready,
)
from bench.receiver import KIND_BUSY, KIND_HEALTHY, KIND_SLOW
from hooklane.delivery import DeliverySpec
from hooklane.settings import Settings

SLOW = 0  # the index of the slow endpoint; every other one is healthy
BUSY = 1  # with --adaptive, the index of the endpoint answering 429 beyond its open calls
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
    # --adaptive: the endpoint BUSY gets busy_rate of the events; its
    # receiver takes busy_open calls at once, each for busy_delay seconds
    # (busy_open / busy_delay calls a second at most), and answers 429 to
    # every call beyond them, with a Retry-After of busy_retry_after
    # seconds unless 0. Its maxConcurrency is busy_max_concurrency (more
    # than the receiver takes), adaptive or not.
    busy: bool = False
    busy_rate: float = 12
    busy_open: int = 4
    busy_delay: float = 0.5
    busy_max_concurrency: int = 16
    busy_adaptive: bool = False
    busy_retry_after: int = 0
    adapt_step: float = Settings().adaptive_step_seconds  # HOOKLANE_ADAPTIVE_STEP_SECONDS
    # --ordered-keys: every event carries one of this many ordering keys (0: none).
    ordered_keys: int = 0


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
        endpoints=20,
        rate=30,
        slow_rate=6,
        slow_delay=1,
        duration=3,
        grace=1,
        slots=(16,),
        receivers=1,
        busy_rate=6,
        busy_open=2,
        adapt_step=0.5,
    ),
}
# --adaptive: (adaptive?, Retry-After seconds) of each run; the smoke preset
# runs today's and the adaptive one with Retry-After only.
RETRY_AFTER = 1
ADAPTIVE_RUNS = ((False, 0), (True, 0), (False, RETRY_AFTER), (True, RETRY_AFTER))
SMOKE_ADAPTIVE_RUNS = ((False, 0), (True, RETRY_AFTER))


# --------------------------------------------------------------------------
# Load


def schedule(cfg: Config) -> list[tuple[float, int]]:
    """(offset in seconds, endpoint index) of every event, evenly paced: the
    slow endpoint at ``slow_rate`` (and the busy one at ``busy_rate``), the
    rest round-robin over the healthy."""
    paced = {SLOW: cfg.slow_rate, **({BUSY: cfg.busy_rate} if cfg.busy else {})}
    events = [(n / rate, i) for i, rate in paced.items() for n in range(int(cfg.duration * rate))]
    healthy_rate = cfg.rate - sum(paced.values())
    for n in range(int(cfg.duration * healthy_rate)):
        events.append((n / healthy_rate, len(paced) + n % (cfg.endpoints - len(paced))))
    return sorted(events)


async def publish_hooklane(conn: asyncpg.Connection, endpoint: int, n: int, *, keys: int = 0) -> None:
    """``keys``: the event carries ordering key n mod keys (0: none)."""
    async with conn.transaction():
        await hooklane.publish(
            conn,
            tenant=f"t{endpoint}",
            type=EVENT_TYPE,
            data={"t": time.time(), "n": n},
            ordering_key=f"k{n % keys}" if keys else None,
        )


async def publish_baseline(conn: asyncpg.Connection, endpoint: int, n: int) -> None:
    await baseline.publish(conn, endpoint, "msg_" + uuid.uuid4().hex, EVENT_TYPE, {"t": time.time(), "n": n})


async def publish_load(dsn: str, system: str, cfg: Config, events: list[tuple[float, int]]) -> float:
    """Publish on schedule from a few connections; returns how far behind
    schedule the publisher fell at worst (seconds), to show it kept up."""
    if system == "baseline":
        publish = publish_baseline
    else:
        publish = functools.partial(publish_hooklane, keys=cfg.ordered_keys)
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


def endpoint_path(i: int, cfg: Config) -> str:
    if i == SLOW:
        return f"slow/{i}"
    if cfg.busy and i == BUSY:
        retry_after = f"&retry_after={cfg.busy_retry_after}" if cfg.busy_retry_after else ""
        return f"busy/{i}?open={cfg.busy_open}&delay={cfg.busy_delay}{retry_after}"
    return f"h/{i}"


async def setup_hooklane(dsn: str, urls: list[str], cfg: Config, slots: int):
    limits = {SLOW: (cfg.max_concurrency, cfg.slow_timeout)}
    terms = {}
    if cfg.busy:
        limits[BUSY] = (cfg.busy_max_concurrency, 5)
        terms[BUSY] = DeliverySpec(adaptive=cfg.busy_adaptive)
    conn = await asyncpg.connect(dsn)
    try:
        await create_endpoints(conn, urls, slow=limits, delivery=terms)
    finally:
        await conn.close()
    worker = start_worker(dsn, worker_concurrency=str(slots), adaptive_step_seconds=str(cfg.adapt_step))
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


# The busy endpoint as the database sees it: the concurrency limit in force
# (its effective concurrency within maxConcurrency), its calls reserved, and
# whether a Retry-After holds it or its circuit pauses it.
BUSY_STATE = """
SELECT hooklane_concurrency(ep) AS concurrency, ep.effective_concurrency,
       coalesce(ep.throttled_until > now(), false) AS held,
       coalesce(ep.paused_until > now(), false) AS paused, ep.consecutive_failures,
       (SELECT count(*) FROM deliveries d WHERE d.endpoint_id = ep.id AND d.state = 'sending') AS sending
FROM endpoints ep WHERE ep.name = 'ep-1'"""


async def sample_db(dsn: str, system: str, cfg: Config, stop: asyncio.Event) -> tuple[int, list[dict]]:
    """Every 0.2 s until ``stop``: the peak of SLOW_SENDING, and with
    ``cfg.busy`` each BUSY_STATE, timed."""
    conn = await asyncpg.connect(dsn)
    peak, busy = 0, []
    try:
        while not stop.is_set():
            peak = max(peak, await conn.fetchval(SLOW_SENDING[system]))
            if cfg.busy:
                busy.append({"t": time.time(), **dict(await conn.fetchrow(BUSY_STATE))})
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.2)
    finally:
        await conn.close()
    return peak, busy


BACKLOG = {
    # $1: the busy endpoint's name, or '' without one.
    "hooklane": """
        SELECT count(*) FILTER (WHERE ep.name = 'ep-0') AS slow_pending,
               count(*) FILTER (WHERE ep.name NOT IN ('ep-0', $1)) AS healthy_pending,
               count(*) FILTER (WHERE ep.name = $1) AS busy_pending,
               extract(epoch FROM now() - min(d.created_at) FILTER (WHERE ep.name NOT IN ('ep-0', $1)))
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
# The busy endpoint's deliveries by state, and its attempts by outcome.
BUSY_END = """
SELECT (SELECT jsonb_object_agg(state, n) FROM (SELECT d.state, count(*) AS n FROM deliveries d
        WHERE d.endpoint_id = ep.id GROUP BY d.state) s) AS deliveries,
       (SELECT jsonb_object_agg(outcome, n) FROM (SELECT a.outcome, count(*) AS n FROM delivery_attempts a
        WHERE a.endpoint_id = ep.id GROUP BY a.outcome) o) AS attempts
FROM endpoints ep WHERE ep.name = 'ep-1'"""


async def run_once(server_dsn: str, system: str, slots: int, cfg: Config, receivers: list[str]) -> dict:
    urls = [f"{receivers[i % len(receivers)]}/{endpoint_path(i, cfg)}" for i in range(cfg.endpoints)]
    async with fresh_database(server_dsn, f"incident_{system}") as dsn:
        setup = setup_hooklane if system == "hooklane" else setup_baseline
        worker = await setup(dsn, urls, cfg, slots)
        try:
            async with aiohttp.ClientSession() as http:
                for r in receivers:
                    await http.post(f"{r}/_reset")
                started = time.time()
                stop = asyncio.Event()
                sampler = asyncio.create_task(sample_db(dsn, system, cfg, stop))
                behind = await publish_load(dsn, system, cfg, schedule(cfg))
                await asyncio.sleep(cfg.grace)
                stop.set()
                db_peak, busy_states = await sampler
                ended = time.time()
                stats = [await (await http.get(f"{r}/_stats")).json() for r in receivers]
            conn = await asyncpg.connect(dsn)
            try:
                args = ("ep-1" if cfg.busy else "",) if system == "hooklane" else ()
                backlog = dict(await conn.fetchrow(BACKLOG[system], *args))
                busy_end = (
                    {k: json.loads(v or "{}") for k, v in (await conn.fetchrow(BUSY_END)).items()}
                    if cfg.busy
                    else {}
                )
            finally:
                await conn.close()
        finally:
            stop_process(worker, grace=1.0)
    result = {
        **analyse(system, slots, cfg, started, ended, behind, stats, backlog),
        "slow_peak_sending_in_db": db_peak,
    }
    if cfg.busy:
        result["busy"] = analyse_busy(cfg, started, ended, stats, busy_states, busy_end)
    return result


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
    # Calls answered 2xx (a /busy/ path's 429s are no delivery).
    arrivals = sorted(
        a for s in stats for a, status in zip(s["arrivals"], s["statuses"], strict=True) if status < 300
    )
    healthy = [
        (t - started, lag) for t, lag, kind in arrivals if kind == KIND_HEALTHY and not math.isnan(lag)
    ]
    per_second: dict[int, list[float]] = defaultdict(list)
    delivered_per_second: dict[int, int] = defaultdict(int)
    for t, _lag, _kind in arrivals:
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
        "run": run_name(system, cfg),
        "ordered_keys": cfg.ordered_keys,
        "slots": slots,
        "published": int(cfg.duration * cfg.rate),
        "publisher_behind_max_s": round(behind, 3),
        "healthy_lag": summary([lag for _, lag in healthy]),
        "healthy_worst_second_p99": max(p99s) if p99s else float("nan"),
        "healthy_delivered": len(healthy),
        "slow_delivered": sum(1 for a in arrivals if a[2] == KIND_SLOW),
        "slow_peak_in_flight": stats[0]["slow_peak"],
        "deliveries_per_s": len(arrivals) / (ended - started),
        "backlog_at_end": backlog,
        "series": series,
        "slow_in_flight": in_flight,
    }


def analyse_busy(
    cfg: Config, started: float, ended: float, stats: list[dict], states: list[dict], end: dict
) -> dict:
    """The busy endpoint's run: its calls at the receiver (answered, and
    429s) per minute, its delivered rate, and from the database the limit
    in force, its calls reserved and its holds over time."""
    calls = sorted(
        (t - started, status, lag)
        for s in stats
        for (t, lag, kind), status in zip(s["arrivals"], s["statuses"], strict=True)
        if kind == KIND_BUSY
    )
    seconds = ended - started
    refused = [t for t, status, _lag in calls if status == 429]
    delivered = [(t, lag) for t, status, lag in calls if status < 300]
    minutes = range(max(1, int(seconds // 60)))
    series = {
        "t": [round(x["t"] - started, 2) for x in states],
        **{k: [x[k] for x in states] for k in ("concurrency", "sending", "held", "paused")},
    }
    limits = series["concurrency"]
    return {
        "capacity_per_s": cfg.busy_open / cfg.busy_delay,
        "offered_per_s": cfg.busy_rate,
        "calls": len(calls),
        "refused_429": len(refused),
        "refused_429_per_minute": len(refused) * 60 / seconds,
        "refused_429_by_minute": [sum(1 for t in refused if int(t // 60) == m) for m in minutes],
        "refused_429_by_10s": [
            sum(1 for t in refused if int(t // 10) == i) for i in range(math.ceil(seconds / 10))
        ],
        "delivered": len(delivered),
        "delivered_per_s": len(delivered) / seconds,
        "delivered_by_minute": [sum(1 for t, _ in delivered if int(t // 60) == m) for m in minutes],
        "lag": summary([lag for _t, lag in delivered if not math.isnan(lag)]),
        "limit": {
            "mean": sum(limits) / len(limits) if limits else float("nan"),
            "p50": percentile(limits, 50),
            "min": min(limits, default=None),
            "max": max(limits, default=None),
        },
        "sending_mean": sum(series["sending"]) / len(limits) if limits else float("nan"),
        "held_share": sum(series["held"]) / len(limits) if limits else float("nan"),
        "paused_share": sum(series["paused"]) / len(limits) if limits else float("nan"),
        "receiver_peak_open": max(s["busy_peak"] for s in stats),
        "at_end": end,
        "series": series,
    }


# --------------------------------------------------------------------------
# Report


def run_name(system: str, cfg: Config) -> str:
    """The system, and its ordering keys if any: what a plot and a line name."""
    return f"{system}, {cfg.ordered_keys} keys" if cfg.ordered_keys else system


def three_panels():
    """A figure of three panels, one above the other, sharing their x axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(3, 1, figsize=(9, 9), sharex=True)


def save(fig, title: str, path: Path) -> None:
    import matplotlib.pyplot as plt

    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def plot(results: list[dict], cfg: Config, slots: int, path: Path) -> None:
    colours = {"hooklane": "tab:blue", "baseline": "tab:red"}
    fig, (lag_ax, slow_ax, rate_ax) = three_panels()
    for r in results:
        # An ordered run is Hooklane's second line: green.
        s, c, name = r["series"], "tab:green" if r["ordered_keys"] else colours[r["system"]], r["run"]
        lag_ax.plot(s["second"], s["healthy_p99"], color=c, label=f"{name} p99")
        lag_ax.plot(s["second"], s["healthy_max"], color=c, linestyle=":", label=f"{name} max")
        t, n = zip(*r["slow_in_flight"], strict=False) if r["slow_in_flight"] else ((), ())
        slow_ax.step(t, n, where="post", color=c, label=name)
        rate_ax.plot(s["second"], s["deliveries"], color=c, label=name)
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
    save(
        fig,
        f"{cfg.endpoints} endpoints, {cfg.rate:g} events/s, {cfg.slow_rate:g}/s to one answering in "
        f"{cfg.slow_delay:g} s; {slots} slots",
        path,
    )


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


def ordered_verdict(results: list[dict], cfg: Config) -> dict:
    """--ordered-keys: per slot count, the healthy lag without ordering and
    with it, side by side."""
    out = {}
    for slots in cfg.slots:
        plain, ordered = (
            next(r for r in results if r["slots"] == slots and bool(r["ordered_keys"]) == o)
            for o in (False, True)
        )
        out[str(slots)] = {
            "ordered_keys": ordered["ordered_keys"],
            **{
                f"{name}_{k}": r["healthy_lag"][k]
                for name, r in (("unordered", plain), ("ordered", ordered))
                for k in ("p50", "p99", "max")
            },
            "unordered_worst_second_p99": plain["healthy_worst_second_p99"],
            "ordered_worst_second_p99": ordered["healthy_worst_second_p99"],
            "p99_ratio_ordered_over_unordered": ordered["healthy_lag"]["p99"] / plain["healthy_lag"]["p99"],
            "unordered_healthy_pending_at_end": plain["backlog_at_end"]["healthy_pending"],
            "ordered_healthy_pending_at_end": ordered["backlog_at_end"]["healthy_pending"],
            "unordered_slow_peak_in_flight": plain["slow_peak_in_flight"],
            "ordered_slow_peak_in_flight": ordered["slow_peak_in_flight"],
            "unordered_slow_delivered": plain["slow_delivered"],
            "ordered_slow_delivered": ordered["slow_delivered"],
            "unordered_deliveries_per_s": plain["deliveries_per_s"],
            "ordered_deliveries_per_s": ordered["deliveries_per_s"],
        }
    return out


def plot_busy(results: list[dict], cfg: Config, path: Path) -> None:
    """The busy endpoint of each --adaptive run: its limit in force, its
    429s per 10 s, and the healthy endpoints' p99 lag per second."""
    fig, (limit_ax, refused_ax, lag_ax) = three_panels()
    for r in results:
        b, label = r["busy"], busy_label(r["config"])
        limit_ax.step(b["series"]["t"], b["series"]["concurrency"], where="post", label=label)
        refused_ax.plot(
            [10 * i for i in range(len(b["refused_429_by_10s"]))], b["refused_429_by_10s"], label=label
        )
        lag_ax.plot(r["series"]["second"], r["series"]["healthy_p99"], label=label)
    limit_ax.axhline(cfg.busy_open, color="grey", linestyle="--", linewidth=0.8, label="calls it takes")
    limit_ax.set_ylabel("busy endpoint: limit in force")
    limit_ax.legend(fontsize=8)
    refused_ax.set_ylabel("busy endpoint: 429s per 10 s")
    refused_ax.set_yscale("symlog")
    refused_ax.set_ylim(bottom=0)
    lag_ax.set_yscale("log")
    lag_ax.set_ylabel("healthy p99 lag (s)")
    lag_ax.set_xlabel("seconds since publishing started")
    save(
        fig,
        f"{cfg.endpoints} endpoints, {cfg.rate:g} events/s; {cfg.busy_rate:g}/s to one taking"
        f" {cfg.busy_open} calls of {cfg.busy_delay:g} s at once, 429 beyond",
        path,
    )


def busy_label(cfg: dict) -> str:
    retry_after = f"Retry-After {cfg['busy_retry_after']} s" if cfg["busy_retry_after"] else "no Retry-After"
    return f"{'adaptive' if cfg['busy_adaptive'] else 'not adaptive'}, {retry_after}"


def adaptive_verdict(results: list[dict]) -> list[dict]:
    """One row per --adaptive run: the healthy lag beside the busy endpoint's figures."""
    return [
        {
            "busy": busy_label(r["config"]),
            "healthy_p50": r["healthy_lag"]["p50"],
            "healthy_p99": r["healthy_lag"]["p99"],
            "healthy_worst_second_p99": r["healthy_worst_second_p99"],
            "healthy_pending_at_end": r["backlog_at_end"]["healthy_pending"],
            "busy_429_per_minute": r["busy"]["refused_429_per_minute"],
            "busy_delivered_per_s": r["busy"]["delivered_per_s"],
            "busy_capacity_per_s": r["busy"]["capacity_per_s"],
            "busy_limit_mean": r["busy"]["limit"]["mean"],
            "busy_paused_share": r["busy"]["paused_share"],
            "busy_held_share": r["busy"]["held_share"],
        }
        for r in results
    ]


def planned(cfg: Config, args: argparse.Namespace) -> list[tuple[Config, str, int]]:
    """(configuration, system, slots) of each run, in running order."""
    if args.ordered_keys:
        # Without ordering and with it, alternating which goes first.
        both = [cfg, replace(cfg, ordered_keys=args.ordered_keys)]
        return [
            (run_cfg, "hooklane", slots)
            for i, slots in enumerate(cfg.slots)
            for run_cfg in (both if i % 2 == 0 else both[::-1])
        ]
    if not args.adaptive:
        return [(cfg, system, slots) for slots in cfg.slots for system in ("hooklane", "baseline")]
    slots = args.slots[0] if args.slots else DEFAULT_SLOTS
    runs = SMOKE_ADAPTIVE_RUNS if args.preset == "smoke" else ADAPTIVE_RUNS
    return [
        (replace(cfg, busy=True, busy_adaptive=adaptive, busy_retry_after=retry_after), "hooklane", slots)
        for adaptive, retry_after in runs
    ]


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(
        cfg, **{k: v for k, v in (("duration", args.duration), ("slow_delay", args.slow_delay)) if v}
    )
    if args.slots:
        cfg = replace(cfg, slots=tuple(args.slots))
    procs, receivers = start_receivers(cfg.receivers, cfg.slow_delay)
    results = []
    try:
        await wait_receivers(receivers)
        with postgres_server(args.dsn) as server:
            for run_cfg, system, slots in planned(cfg, args):
                r = {**await run_once(server, system, slots, run_cfg, receivers), "config": asdict(run_cfg)}
                busy = r.get("busy")
                print(
                    f"{r['run']:9s} slots={slots:3d} healthy p50={r['healthy_lag']['p50']:.3f}s "
                    f"p99={r['healthy_lag']['p99']:.3f}s max={r['healthy_lag']['max']:.3f}s "
                    f"slow peak={r['slow_peak_in_flight']} (db {r['slow_peak_sending_in_db']}) backlog={r['backlog_at_end']}"
                    + (
                        f" busy ({busy_label(r['config'])}): {busy['delivered_per_s']:.2f} del/s, "
                        f"{busy['refused_429_per_minute']:.0f} 429s/min, limit mean {busy['limit']['mean']:.2f}"
                        if busy
                        else ""
                    ),
                    flush=True,
                )
                results.append(r)
    finally:
        for p in procs:
            stop_process(p)
    if args.plot_dir:
        plots = Path(args.plot_dir)
        if args.adaptive:
            plot_busy(results, cfg, plots / f"incident-adaptive-{args.preset}.png")
        for slots in () if args.adaptive else cfg.slots:
            plot(
                [r for r in results if r["slots"] == slots],
                cfg,
                slots,
                plots / f"incident-{'ordered-' if args.ordered_keys else ''}{args.preset}-{slots}.png",
            )
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "verdict": (
            adaptive_verdict(results)
            if args.adaptive
            else ordered_verdict(results, cfg)
            if args.ordered_keys
            else verdict(results, cfg)
        ),
        "runs": results,
    }


def main() -> None:
    parser = bench_parser("seed 000's incident: Hooklane vs the naive FIFO", PRESETS)
    parser.add_argument("--slots", type=int, action="append", help="in-flight slots (repeatable)")
    parser.add_argument("--duration", type=float, help="seconds of publishing, overriding the preset")
    parser.add_argument(
        "--slow-delay", type=float, help="the slow endpoint's answer time, overriding the preset"
    )
    parser.add_argument(
        "--adaptive",
        action="store_true",
        help="Hooklane only, with an endpoint answering 429 beyond its open calls, adaptive and not",
    )
    parser.add_argument(
        "--ordered-keys",
        type=int,
        metavar="N",
        help="Hooklane only, without ordering and with every event carrying one of N ordering keys",
    )
    parser.add_argument(
        "--correlated",
        action="store_true",
        help="issue 39: phases of many endpoints slow or hanging at once, a tenant's, a self-service one"
        " (bench/correlated.py)",
    )
    parser.add_argument(
        "--before-tree",
        type=Path,
        help="--correlated: run the same load first against this source tree's worker (today's main)",
    )
    parser.add_argument(
        "--worker-setting",
        action="append",
        metavar="NAME=VALUE",
        help="--correlated: HOOKLANE_NAME=VALUE for both workers (repeatable)",
    )
    parser.add_argument(
        "--phase-seconds", type=float, help="--correlated: seconds per phase, overriding the preset"
    )
    parser.add_argument(
        "--fair-budget",
        type=int,
        help="--correlated: calls the slow endpoints share fairly (default: WORKER_LONG_CALLS if set, else the"
        " worker's slots)",
    )
    parser.add_argument("--plot-dir", default=str(DOCS / "img"), help="'' for no plot")
    parser.add_argument("--json", help="write the full results here")
    args = parser.parse_args()
    if args.correlated and (
        args.adaptive or args.slots or args.duration or args.slow_delay or args.ordered_keys
    ):
        parser.error(
            "--correlated has phases of its own: no --adaptive, --slots, --duration, --slow-delay or --ordered-keys"
        )
    if args.ordered_keys is not None and (args.ordered_keys < 1 or args.adaptive):
        parser.error("--ordered-keys takes a positive number of keys, and no --adaptive")
    correlated_only = (args.before_tree, args.worker_setting, args.phase_seconds, args.fair_budget)
    if not args.correlated and any(v is not None for v in correlated_only):
        parser.error(
            "--before-tree, --worker-setting, --phase-seconds and --fair-budget go with --correlated"
        )
    if (args.fair_budget is not None and args.fair_budget < 1) or (
        args.phase_seconds is not None and not args.phase_seconds > 0
    ):
        parser.error("--fair-budget and --phase-seconds must be positive")
    if args.before_tree is not None and not (args.before_tree / "hooklane").is_dir():
        parser.error(f"--before-tree {args.before_tree} holds no hooklane/ package")
    if args.before_tree is not None:
        # Its processes start in this repository, its migration where this runs.
        args.before_tree = args.before_tree.resolve()
    if args.correlated:
        run_and_report(correlated.main_async, args)
    else:
        run_and_report(main_async, args, _brief)


def _brief(result: dict) -> dict:
    """The result without the per-second series."""
    runs = [
        {
            **{k: v for k, v in r.items() if k not in ("series", "slow_in_flight", "config")},
            **({"busy": {k: v for k, v in r["busy"].items() if k != "series"}} if "busy" in r else {}),
        }
        for r in result["runs"]
    ]
    return {**{k: v for k, v in result.items() if k != "runs"}, "runs": runs}


if __name__ == "__main__":
    main()

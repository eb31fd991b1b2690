"""Correlated incidents (issue 39): many endpoints slow at once, a tenant's
fleet slow, an endpoint at the self-service bounds; run by
``python -m bench.incident --correlated``.

The seed's 1,800 endpoints (full preset), each in a tenant of a few
endpoints but for one tenant of 200, with 100 healthy events/s spread over
the endpoints healthy at the time. One run goes through phases of a fixed
duration each, and in every phase the receivers, by path, make a share of
the endpoints slow (204 after ``slow_delay`` s, inside the 5 s deadline) or
hanging (no answer: the worker times out at 5 s and retries after its
backoff); the URLs never change. Slow and hanging endpoints get
``slow_rate`` events/s each. The phases: 0%, 1%, 10%, 50%, 90% slow; the
200 endpoints of one tenant slow; one endpoint created at the platform's
self-service bounds (``portal_max_concurrency`` calls,
``portal_max_timeout`` s deadline) answering after ``self_service_delay`` s,
with ``self_service_events`` events queued to it at once, as a replay does;
10% hanging, last, as the circuits it opens stay open for minutes.
Between phases (and for a while before the first) every endpoint answers
at once and only the healthy load goes on, for two seconds at least and
until the backlog due is under a second of it (at most ``settle_max`` s,
not measured): a platform's traffic does not pause between incidents.

Measured per phase, at the receivers: the lag of each healthy event
published in the phase (first arrival minus its transaction's commit,
whenever it arrives; from the publish call, ``data.t``, beside it),
deliveries per second to the slow endpoints in all and per endpoint
(beside a fair share: the worker's budget for long calls,
``--fair-budget``, split evenly over the slow endpoints, each call holding
``slow_delay`` s; never more than the endpoint's own rate), calls open to
slow and to hanging endpoints; from /proc, the worker's RSS and open file
descriptors, and RSS per call in flight above the 0% phase. At the end, from
the database: every event published has its delivery, delivered or still
queued, none dead or discarded.

``--before-tree DIR`` runs the same load first against the worker of
another source tree (today's main, a ``git worktree``), its database
migrated and its endpoints created by that tree; then this checkout's.
``--worker-setting NAME=VALUE`` (repeatable) is passed to both workers as
HOOKLANE_NAME (a worker ignores a setting it does not know).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import aiohttp
import asyncpg

from bench.common import (
    REPO,
    SECRET,
    fresh_database,
    machine,
    percentile,
    postgres_server,
    python_module,
    start_receivers,
    start_worker,
    stop_process,
    summary,
    wait_receivers,
    wait_workers_ready,
)
from bench.receiver import KIND_SLOW
from hooklane.settings import Settings

SELF_SERVICE = "self"  # the self-service endpoint's tenant and name suffix
BIG_TENANT = "big"
# Targets of the issue: healthy p99 at most this, and at most this times the 0% phase's.
P99_TARGET_S = 0.1
P99_TARGET_RATIO = 2.0
# RSS and fds per call in flight are reported where a phase holds at least
# this many calls more than the 0% phase: below it, the noise is the figure.
PER_CALL_MIN_CALLS = 50


@dataclass(frozen=True)
class Config:
    endpoints: int  # regular endpoints; the self-service one comes on top
    rate: float  # healthy events/s in all, over the endpoints healthy in the phase
    slow_rate: float  # events/s to each slow or hanging endpoint
    slow_delay: float  # seconds a slow endpoint takes to answer (204)
    phase_seconds: float  # publishing per phase
    settle_max: float  # seconds at most between phases for the backlog to drain
    receivers: int  # receiver processes
    tenant_size: int  # endpoints per tenant, but for the big tenant
    big_tenant: int  # endpoints of the one big tenant
    self_service_events: int  # queued at once to the self-service endpoint
    self_service_delay: float  # seconds the self-service endpoint takes to answer
    # The self-service endpoint's limit and deadline: the platform's bounds
    # set to the largest HOOKLANE_PORTAL_MAX_CONCURRENCY and
    # HOOKLANE_PORTAL_MAX_TIMEOUT_SECONDS allow, and the endpoint created at
    # them, as the portal would write it.
    portal_max_concurrency: int = 256
    portal_max_timeout: int = 60
    timeout: int = 5  # every other endpoint's deadline (the default)
    max_concurrency: int = 4  # every other endpoint's limit (the default)
    worker_concurrency: int = Settings().worker_concurrency
    publishers: int = 4  # concurrent publishing connections


PRESETS = {
    "full": Config(
        endpoints=1800,
        rate=100,
        slow_rate=0.5,
        slow_delay=4,
        phase_seconds=45,
        settle_max=60,
        receivers=2,
        tenant_size=3,
        big_tenant=200,
        self_service_events=1000,
        self_service_delay=40,
    ),
    "quick": Config(
        endpoints=600,
        rate=60,
        slow_rate=0.5,
        slow_delay=4,
        phase_seconds=25,
        settle_max=30,
        receivers=1,
        tenant_size=3,
        big_tenant=100,
        self_service_events=600,
        self_service_delay=40,
    ),
    "smoke": Config(
        endpoints=40,
        rate=20,
        slow_rate=1,
        slow_delay=1,
        phase_seconds=2,
        settle_max=3,
        receivers=1,
        tenant_size=3,
        big_tenant=8,
        self_service_events=10,
        self_service_delay=3,
        portal_max_concurrency=8,
        portal_max_timeout=5,
        timeout=2,
    ),
}


@dataclass
class Sent:
    """An event the benchmark published: in which phase, of which class
    (healthy, slow, hang, self), to which endpoint, when its publish was
    called and when its transaction committed."""

    phase: int
    cls: str
    endpoint: int
    at: float = math.nan
    committed: float = math.nan


@dataclass(frozen=True)
class Phase:
    name: str
    slow: float = 0.0  # share of the regular endpoints slow
    hang: float = 0.0  # share hanging
    big_tenant: bool = False  # the big tenant's endpoints all slow
    self_service: bool = False  # events queued to the self-service endpoint


PHASES = (
    Phase("0% slow"),
    Phase("1% slow", slow=0.01),
    Phase("10% slow", slow=0.10),
    Phase("50% slow", slow=0.50),
    Phase("90% slow", slow=0.90),
    Phase("one tenant's endpoints slow", big_tenant=True),
    Phase("self-service endpoint at the bounds", self_service=True),
    # Last: its endpoints fail, and their circuits open (20 failures in a
    # row) for minutes after they answer again, which a phase after it
    # would count as the healthy endpoints' lag.
    Phase("10% hanging", hang=0.10),
)


# --------------------------------------------------------------------------
# Endpoints and phases


def tenant_of(i: int, cfg: Config) -> str:
    if i == cfg.endpoints:
        return SELF_SERVICE
    if i < cfg.big_tenant:
        return BIG_TENANT
    return f"t{(i - cfg.big_tenant) // cfg.tenant_size}"


def path_of(i: int) -> str:
    return f"/c/{i}"


def endpoint_rows(cfg: Config, receivers: list[str]) -> list[dict]:
    """Every endpoint as created: regular ones at the defaults, the last at
    the self-service bounds. Each takes only its own event type, so that an
    event goes to one endpoint whatever its tenant holds."""
    return [
        {
            "name": f"ep-{SELF_SERVICE if i == cfg.endpoints else i}",
            "url": receivers[i % len(receivers)] + path_of(i),
            "tenant": tenant_of(i, cfg),
            "type": f"bench.e{i}",
            "max_concurrency": cfg.portal_max_concurrency if i == cfg.endpoints else cfg.max_concurrency,
            "timeout_seconds": cfg.portal_max_timeout if i == cfg.endpoints else cfg.timeout,
        }
        for i in range(cfg.endpoints + 1)
    ]


async def create_endpoints_async(dsn: str, rows: list[dict]) -> None:
    """Run by the tree under test (see create_in_tree): its own upsert."""
    from hooklane import store
    from hooklane.spec import EndpointSpec

    conn = await asyncpg.connect(dsn)
    try:
        async with conn.transaction():
            for r in rows:
                spec = EndpointSpec(
                    namespace="bench",
                    name=r["name"],
                    url=r["url"],
                    tenant=r["tenant"],
                    max_concurrency=r["max_concurrency"],
                    timeout_seconds=r["timeout_seconds"],
                    event_types=(r["type"],),
                )
                await store.upsert_endpoint(conn, spec, SECRET)
    finally:
        await conn.close()


async def create_in_tree(dsn: str, rows: list[dict], tree: Path | None) -> None:
    """Create the endpoints with ``tree``'s store, so that the rows match the
    schema it migrated."""
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(rows, f)
        f.flush()
        proc = await asyncio.create_subprocess_exec(
            *python_module("bench.correlated", "create", dsn, f.name, tree=tree),
            cwd=REPO,
        )
        if await proc.wait() != 0:
            raise RuntimeError(f"creating the endpoints with {tree or 'this tree'} failed")


def phase_sets(phase: Phase, cfg: Config) -> tuple[list[int], list[int], list[int]]:
    """(slow, hanging, healthy) regular endpoints of a phase. The slow and
    hanging ones are the first of one fixed shuffle, so each phase's set
    holds the smaller phases' sets; the healthy ones are shuffled so that
    consecutive healthy events go to different tenants."""
    order = random.Random(39).sample(range(cfg.endpoints), cfg.endpoints)
    slow = sorted(order[: round(phase.slow * cfg.endpoints)])
    if phase.big_tenant:
        slow = list(range(cfg.big_tenant))
    hang = sorted(order[: round(phase.hang * cfg.endpoints)])
    unhealthy = set(slow) | set(hang)
    healthy = [i for i in order if i not in unhealthy]
    return slow, hang, healthy


def schedule(phase: Phase, cfg: Config) -> list[tuple[float, int, str]]:
    """(offset, endpoint, class) of every event of a phase: the healthy rate
    round-robin over the healthy endpoints, ``slow_rate`` to each slow or
    hanging one (staggered), and the self-service queue at once."""
    slow, hang, healthy = phase_sets(phase, cfg)
    events = [
        (n / cfg.rate, healthy[n % len(healthy)], "healthy") for n in range(int(cfg.phase_seconds * cfg.rate))
    ]
    for cls, members in (("slow", slow), ("hang", hang)):
        for j, i in enumerate(members):
            stagger = j / len(members)
            per = int(cfg.phase_seconds * cfg.slow_rate)
            events += [((k + stagger) / cfg.slow_rate, i, cls) for k in range(per)]
    if phase.self_service:
        events += [(0.0, cfg.endpoints, "self")] * cfg.self_service_events
    return sorted(events, key=lambda e: e[0])


def behaviour(phase: Phase | None, cfg: Config) -> dict:
    """The receivers' /_behave body for a phase (None: between phases, when
    every endpoint answers at once)."""
    body: dict = {"slow": {}, "hang": []}
    if phase is not None:
        slow, hang, _ = phase_sets(phase, cfg)
        body = {"slow": {path_of(i): cfg.slow_delay for i in slow}, "hang": [path_of(i) for i in hang]}
        if phase.self_service:
            body["slow"][path_of(cfg.endpoints)] = cfg.self_service_delay
    return body


# --------------------------------------------------------------------------
# Publishing


# The SQL publish function of every release since migration 0012: the
# library of this checkout calls its own release's version, which a tree
# before it (--before-tree) lacks, and both are published to alike.
PUBLISH = "SELECT hooklane_publish_v1($1, $2, $3::jsonb)"


async def publish_phase(
    dsn: str,
    cfg: Config,
    events: list[tuple[float, int, str]],
    first: int,
    meta: list[Sent],
    index: int,
    stop: asyncio.Event | None = None,
) -> float:
    """Publish a phase's events on schedule from ``cfg.publishers``
    connections, those due together in one transaction; event ``n``
    (numbered from ``first``) carries its number and publish time in its
    data, and ``meta[n]`` says what it is and when it was published.
    Returns how far behind schedule publishing fell at worst. ``stop``
    set: no batch starts after it, and those not published keep no time."""
    start = time.time()
    numbered = [(first + k, offset, i, cls) for k, (offset, i, cls) in enumerate(events)]
    meta.extend(Sent(index, cls, i) for _n, _o, i, cls in numbered)
    queue = list(reversed(numbered))
    behind = 0.0

    async def run() -> None:
        nonlocal behind
        conn = await asyncpg.connect(dsn)
        try:
            while queue and not (stop is not None and stop.is_set()):
                wait = start + queue[-1][1] - time.time()
                if wait > 0:
                    await asyncio.sleep(wait)
                    continue
                behind = max(behind, -wait)
                batch = []
                while queue and len(batch) < 20 and start + queue[-1][1] <= time.time():
                    batch.append(queue.pop())
                async with conn.transaction():
                    for n, _offset, i, _cls in batch:
                        meta[n].at = time.time()
                        await conn.execute(
                            PUBLISH, tenant_of(i, cfg), f"bench.e{i}", json.dumps({"t": meta[n].at, "n": n})
                        )
                committed = time.time()
                for n, _offset, _i, _cls in batch:
                    meta[n].committed = committed
        finally:
            await conn.close()

    await asyncio.gather(*(run() for _ in range(cfg.publishers)))
    return behind


# --------------------------------------------------------------------------
# One worker's run


# Deliveries a worker could take now, but for the self-service endpoint's.
DUE = """
SELECT count(*) FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
WHERE (d.state = 'sending' OR (d.state = 'pending' AND d.next_attempt_at <= now()))
  AND ep.tenant <> $1"""
AT_END = """
SELECT (SELECT count(*) FROM events) AS events,
       (SELECT jsonb_object_agg(state, n) FROM (SELECT state, count(*) AS n FROM deliveries GROUP BY state) s)
         AS deliveries"""


# Between phases, the healthy load goes on for this long at least: a
# platform's traffic does not pause between incidents, and a worker that
# saw no event for a while finds the next ones later (its probe backs off).
WARM_SECONDS = 2.0
LATEST_SHOWN = 20
BETWEEN = -1  # the phase of the events published between phases: none


async def settle(dsn: str, cfg: Config, meta: list[Sent]) -> dict:
    """Go on with the healthy load only, at least ``WARM_SECONDS``, until
    the backlog due is below a second of it or ``settle_max`` passed. Its
    events belong to no phase."""
    started = time.time()
    conn = await asyncpg.connect(dsn)
    healthy_only = Phase("between phases")

    settled = asyncio.Event()

    async def keep_publishing() -> None:
        while not settled.is_set():
            await publish_phase(dsn, cfg, schedule(healthy_only, cfg), len(meta), meta, BETWEEN, settled)

    warm = asyncio.create_task(keep_publishing())
    try:
        while True:
            await asyncio.sleep(0.5)
            due = await conn.fetchval(DUE, SELF_SERVICE)
            elapsed = time.time() - started
            if (due <= cfg.rate and elapsed >= WARM_SECONDS) or elapsed > cfg.settle_max:
                return {"seconds": round(elapsed, 1), "due_left": due}
    finally:
        settled.set()
        await warm
        await conn.close()


def proc_sample(pid: int) -> tuple[float, int] | None:
    """(RSS in MB, open fds) of a process, or None once it is gone."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except OSError:
        return None
    kb = next(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return kb / 1024, fds


async def sample_worker(pid: int, stop: asyncio.Event, out: list[tuple[float, float, int]]) -> None:
    while not stop.is_set():
        sample = proc_sample(pid)
        if sample is not None:
            out.append((time.time(), *sample))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), 1.0)


async def behave(http: aiohttp.ClientSession, receivers: list[str], body: dict) -> None:
    for r in receivers:
        async with http.post(f"{r}/_behave", json=body) as response:
            response.raise_for_status()


async def run_worker(
    server_dsn: str,
    label: str,
    tree: Path | None,
    cfg: Config,
    receivers: list[str],
    settings: dict[str, str],
    budget: int,
) -> dict:
    async with fresh_database(server_dsn, f"correlated_{label}", tree=tree) as dsn:
        await create_in_tree(dsn, endpoint_rows(cfg, receivers), tree)
        worker = start_worker(dsn, tree=tree, worker_concurrency=str(cfg.worker_concurrency), **settings)
        try:
            await wait_workers_ready(dsn, 1)
            meta: list[Sent] = []
            windows, samples = [], []
            stop = asyncio.Event()
            sampler = asyncio.create_task(sample_worker(worker.pid, stop, samples))
            async with aiohttp.ClientSession() as http:
                for r in receivers:
                    await http.post(f"{r}/_reset")
                await settle(dsn, cfg, meta)  # the load of the hour before
                for index, phase in enumerate(PHASES):
                    await behave(http, receivers, behaviour(phase, cfg))
                    started = time.time()
                    behind = await publish_phase(dsn, cfg, schedule(phase, cfg), len(meta), meta, index)
                    window = {
                        "phase": phase.name,
                        "start": started,
                        "end": time.time(),
                        "behind_max_s": round(behind, 3),
                    }
                    if index < len(PHASES) - 1:
                        await behave(http, receivers, behaviour(None, cfg))
                        window["settle"] = await settle(dsn, cfg, meta)
                    else:
                        # The healthy events of the last phase still held up get their chance.
                        await asyncio.sleep(cfg.slow_delay + 1)
                    windows.append(window)
                    print(f"  {label}: {phase.name} done {window}", flush=True)
                stop.set()
                await sampler
                collected = time.time()
                stats = [await (await http.get(f"{r}/_stats")).json() for r in receivers]
                await behave(http, receivers, behaviour(None, cfg))
            conn = await asyncpg.connect(dsn)
            try:
                end = dict(await conn.fetchrow(AT_END))
            finally:
                await conn.close()
        finally:
            stop_process(worker, grace=1.0)
    end["deliveries"] = json.loads(end["deliveries"] or "{}")
    return {"worker": label, **analyse(cfg, settings, budget, windows, meta, stats, collected, samples, end)}


# --------------------------------------------------------------------------
# Analysis


# The slow endpoints meet their fair share when their tenants got this much
# of theirs at least: calls started in a window of the phase's length, the
# edges counted off.
FAIR_SHARE_MET = 0.9


def water_fill(capacity: float, demands: dict, /) -> dict:
    """A max-min fair split of ``capacity`` over ``demands``: each gets its
    demand, or an equal share of what the smaller ones left if less."""
    given = {}
    left, n = capacity, len(demands)
    for key, demand in sorted(demands.items(), key=lambda kv: kv[1]):
        given[key] = min(demand, left / n)
        left -= given[key]
        n -= 1
    return given


def fair_shares(
    budget: int, demands: dict[int, float], tenants: dict[int, str], delay: float
) -> dict[int, float]:
    """Deliveries/s each slow endpoint is owed when ``budget`` calls are
    split as the worker's turns split them, tenant first, then endpoint:
    each endpoint asking ``demands[i]`` calls (what it was sent for the
    time a call holds, up to its limit), each call holding ``delay`` s."""
    by_tenant: dict[str, dict[int, float]] = defaultdict(dict)
    for i, calls in demands.items():
        by_tenant[tenants[i]][i] = calls
    tenant_calls = water_fill(budget, {t: sum(e.values()) for t, e in by_tenant.items()})
    return {
        i: calls / delay
        for t, endpoints in by_tenant.items()
        for i, calls in water_fill(tenant_calls[t], endpoints).items()
    }


def per_second_sum(stats: list[dict], key: str, start: float, end: float) -> list[float]:
    """Each second of the window: the receivers' mean count of open calls, summed."""
    seconds = max(1, int(end - start))
    total = [0.0] * seconds
    for s in stats:
        buckets: dict[int, list[int]] = defaultdict(list)
        for t, n in s[key]:
            if start <= t < start + seconds:
                buckets[int(t - start)].append(n)
        for k, values in buckets.items():
            total[k] += sum(values) / len(values)
    return total


def analyse(
    cfg: Config,
    settings: dict[str, str],
    budget: int,
    windows: list[dict],
    meta: list[Sent],
    stats: list[dict],
    collected: float,
    samples: list[tuple[float, float, int]],
    end: dict,
) -> dict:
    # A healthy event's lag counts from its transaction's commit, when it
    # became visible to anyone: a publisher keeping up with 900 events/s puts
    # up to 20 in one transaction, and an event published first in it would
    # otherwise carry the rest of that transaction in its lag. The lag from
    # the publish call (``data.t``) is kept beside it.
    first_lag: dict[int, float] = {}
    first_lag_call: dict[int, float] = {}
    slow_calls: list[tuple[float, str]] = []  # (arrival, path) of calls to slow endpoints
    # Calls that reached a receiver, by the phase and class of their event's publishing.
    calls_by_class: dict[tuple[int, str], int] = defaultdict(int)
    for s in stats:
        for (t, lag, kind), n, path in zip(s["arrivals"], s["numbers"], s["paths"], strict=True):
            if not isinstance(n, int) or not 0 <= n < len(meta):
                continue
            calls_by_class[(meta[n].phase, meta[n].cls)] += 1
            if meta[n].cls == "healthy" and not math.isnan(lag):
                first_lag[n] = min(t - meta[n].committed, first_lag.get(n, math.inf))
                first_lag_call[n] = min(lag, first_lag_call.get(n, math.inf))
            if kind == KIND_SLOW:
                slow_calls.append((t, path))
    # Events published to each slow endpoint, by phase.
    offered: dict[int, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for sent in meta:
        if sent.cls in ("slow", "self"):
            offered[sent.phase][sent.endpoint] += 1
    phases = []
    for index, (phase, w) in enumerate(zip(PHASES, windows, strict=True)):
        start, stop = w["start"], w["end"]
        seconds = stop - start
        healthy_n = [n for n, sent in enumerate(meta) if sent.phase == index and sent.cls == "healthy"]
        lags = [first_lag[n] for n in healthy_n if n in first_lag]
        lags_call = [first_lag_call[n] for n in healthy_n if n in first_lag_call]
        # An event not delivered when the receivers were read has waited at
        # least until then: it counts, with that lower bound.
        waiting = [collected - meta[n].committed for n in healthy_n if n not in first_lag]
        waiting_call = [collected - meta[n].at for n in healthy_n if n not in first_lag]
        slow, hang, _ = phase_sets(phase, cfg)
        slow_ones = slow + ([cfg.endpoints] if phase.self_service else [])
        slow_paths = {path_of(i) for i in slow_ones}
        delay = cfg.self_service_delay if phase.self_service else cfg.slow_delay
        calls = defaultdict(int)
        for t, path in slow_calls:
            if start <= t < stop and path in slow_paths:
                calls[path] += 1
        per_endpoint = [calls[p] / seconds for p in slow_paths]
        limit = cfg.portal_max_concurrency if phase.self_service else cfg.max_concurrency
        sent = {i: offered[index][i] / seconds for i in slow_ones}
        owed = fair_shares(
            budget,
            {i: min(sent[i] * delay, limit) for i in slow_ones},
            {i: tenant_of(i, cfg) for i in slow_ones},
            delay,
        )
        # Per tenant: within one, a few calls each over the phase are too
        # few to tell an endpoint's share from the next's.
        tenant_got: dict[str, float] = defaultdict(float)
        tenant_owed: dict[str, float] = defaultdict(float)
        for i in slow_ones:
            tenant_got[tenant_of(i, cfg)] += calls[path_of(i)] / seconds
            tenant_owed[tenant_of(i, cfg)] += owed[i]
        got = [tenant_got[t] / tenant_owed[t] for t in tenant_owed if tenant_owed[t] > 0]
        slow_open = per_second_sum(stats, "slow_in_flight", start, stop)
        hang_open = per_second_sum(stats, "hang_in_flight", start, stop)
        mine = [(rss, fds) for t, rss, fds in samples if start <= t < stop]
        phases.append(
            {
                "phase": phase.name,
                "seconds": round(seconds, 1),
                "publisher_behind_max_s": w["behind_max_s"],
                "settle": w.get("settle"),
                "healthy_published": len(healthy_n),
                "healthy_delivered": len(lags),
                "healthy_lag": summary(lags + waiting),
                "healthy_lag_from_call": summary(lags_call + waiting_call),
                "healthy_undelivered": len(waiting),
                # The latest healthy events, to tell a stalled endpoint from a
                # slow moment: endpoint, seconds into the phase, lag.
                "healthy_latest": [
                    (meta[n].endpoint, round(meta[n].committed - start, 3), round(lag, 3))
                    for lag, n in sorted(
                        ((first_lag.get(n, collected - meta[n].committed), n) for n in healthy_n),
                        reverse=True,
                    )[:LATEST_SHOWN]
                ],
                "calls_by_class": {cls: n for (p, cls), n in calls_by_class.items() if p == index},
                "slow_endpoints": len(slow_paths),
                "hanging_endpoints": len(hang),
                "slots_asked": len(slow_paths)
                * (cfg.portal_max_concurrency if phase.self_service else cfg.max_concurrency)
                + len(hang) * cfg.max_concurrency,
                "slow_deliveries_per_s": sum(calls.values()) / seconds,
                "slow_per_endpoint_per_s": {
                    "mean": sum(per_endpoint) / len(per_endpoint) if per_endpoint else float("nan"),
                    "p10": percentile(per_endpoint, 10),
                    "min": min(per_endpoint, default=float("nan")),
                },
                "slow_offered_per_endpoint_per_s": mean(list(sent.values())),
                "fair_share_per_endpoint_per_s": mean(list(owed.values())),
                # What the slow endpoints' tenants got of their fair share.
                "slow_vs_fair_share": {"p10": percentile(got, 10), "min": min(got, default=float("nan"))},
                "slow_in_flight": {"mean": mean(slow_open), "max": max(slow_open)},
                "hang_in_flight": {"mean": mean(hang_open), "max": max(hang_open)},
                "worker_rss_mb": {
                    "mean": mean([r for r, _ in mine]),
                    "max": max((r for r, _ in mine), default=float("nan")),
                },
                "worker_fds": {
                    "mean": mean([f for _, f in mine]),
                    "max": max((f for _, f in mine), default=0),
                },
            }
        )
    base = phases[0]
    for p in phases:
        in_flight = p["slow_in_flight"]["mean"] + p["hang_in_flight"]["mean"]
        extra = in_flight - base["slow_in_flight"]["mean"] - base["hang_in_flight"]["mean"]
        grown = p["worker_rss_mb"]["mean"] - base["worker_rss_mb"]["mean"]
        p["in_flight_mean"] = in_flight
        p["rss_kb_per_in_flight_call"] = grown * 1024 / extra if extra >= PER_CALL_MIN_CALLS else None
        p["fds_per_in_flight_call"] = (
            (p["worker_fds"]["mean"] - base["worker_fds"]["mean"]) / extra
            if extra >= PER_CALL_MIN_CALLS
            else None
        )
        p99, base_p99 = p["healthy_lag"]["p99"], base["healthy_lag"]["p99"]
        p["target_p99_under_100ms"] = p99 <= P99_TARGET_S
        p["target_p99_within_2x_of_0pct"] = p99 <= P99_TARGET_RATIO * base_p99
        got = p["slow_vs_fair_share"]["p10"]
        p["target_fair_share"] = None if math.isnan(got) else got >= FAIR_SHARE_MET
    states = end["deliveries"]
    queued = states.get("pending", 0) + states.get("sending", 0)
    published = sum(not math.isnan(sent.at) for sent in meta)
    lost = {
        "published": published,
        "events_in_db": end["events"],
        "deliveries": states,
        "delivered_or_queued": states.get("delivered", 0) + queued,
        "nothing_lost": end["events"] == published == states.get("delivered", 0) + queued,
        "dead": states.get("dead", 0),
        "discarded": states.get("discarded", 0),
    }
    return {
        "settings": settings,
        "fair_budget": budget,
        "phases": phases,
        "at_end": lost,
        "targets_met": all(p["target_p99_under_100ms"] and p["target_p99_within_2x_of_0pct"] for p in phases),
    }


def mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else float("nan")


# --------------------------------------------------------------------------
# Report


def table(runs: list[dict]) -> str:
    """A markdown table, one row per phase and worker, then a line per worker."""
    head = (
        "| phase | worker | slow / hanging endpoints (slots asked) | healthy p50 | p99 | max | not delivered |"
        " p99 targets | p99 from the publish call |"
        " slow del/s | per slow endpoint: mean / p10 / fair share / sent | got / fair share: p10 |"
        " slow / hanging in flight (mean) | worker RSS MB / fds | per call: RSS KB / fds |"
    )
    lines = [head, "|" + " --- |" * (head.count("|") - 1)]
    for index in range(len(PHASES)):
        for r in runs:
            p = r["phases"][index]
            lag, each = p["healthy_lag"], p["slow_per_endpoint_per_s"]
            per_call, fds_per_call = p["rss_kb_per_in_flight_call"], p["fds_per_in_flight_call"]
            fair = {None: "", True: "met", False: "MISSED"}[p["target_fair_share"]]
            lines.append(
                f"| {p['phase']} | {r['worker']} | {p['slow_endpoints']} / {p['hanging_endpoints']}"
                f" ({p['slots_asked']}) | {ms(lag['p50'])} | {ms(lag['p99'])} | {ms(lag['max'])} |"
                f" {p['healthy_undelivered']} of {p['healthy_published']} |"
                f" {'met' if p['target_p99_under_100ms'] and p['target_p99_within_2x_of_0pct'] else 'MISSED'} |"
                f" {ms(p['healthy_lag_from_call']['p99'])} |"
                f" {p['slow_deliveries_per_s']:.1f} | {rate(each['mean'])} / {rate(each['p10'])} /"
                f" {rate(p['fair_share_per_endpoint_per_s'])} / {rate(p['slow_offered_per_endpoint_per_s'])} |"
                f" {rate(p['slow_vs_fair_share']['p10'])} {fair} | {p['slow_in_flight']['mean']:.0f} / {p['hang_in_flight']['mean']:.0f} |"
                f" {p['worker_rss_mb']['mean']:.0f} / {p['worker_fds']['mean']:.0f} |"
                f" {'' if per_call is None else f'{per_call:.0f} / {fds_per_call:.2f}'} |"
            )
    for r in runs:
        end = r["at_end"]
        lines.append(
            f"\n{r['worker']}: p99 targets {'met in every phase' if r['targets_met'] else 'MISSED'};"
            f" {end['published']} events published, {end['delivered_or_queued']} delivered or queued"
            f" ({'nothing lost' if end['nothing_lost'] else 'LOST'}), {end['dead']} dead,"
            f" {end['discarded']} discarded; fair shares of {r['fair_budget']} calls."
        )
    return "\n".join(lines)


def rate(value: float) -> str:
    return "-" if math.isnan(value) else f"{value:.2f}"


def ms(seconds: float) -> str:
    if math.isnan(seconds):
        return "-"
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def plot(runs: list[dict], cfg: Config, path: Path) -> None:
    """Per phase: each worker's healthy p99 (log scale), beside the target."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (lag_ax, slow_ax) = plt.subplots(2, 1, figsize=(10, 7), sharex=True)
    names = [p.name for p in PHASES]
    width = 0.8 / max(1, len(runs))
    for k, r in enumerate(runs):
        xs = [i + (k - (len(runs) - 1) / 2) * width for i in range(len(names))]
        lag_ax.bar(xs, [p["healthy_lag"]["p99"] for p in r["phases"]], width, label=f"{r['worker']} p99")
        slow_ax.bar(
            xs,
            [p["slow_in_flight"]["mean"] + p["hang_in_flight"]["mean"] for p in r["phases"]],
            width,
            label=r["worker"],
        )
    lag_ax.axhline(P99_TARGET_S, color="grey", linestyle="--", linewidth=0.8, label="100 ms target")
    lag_ax.set_yscale("log")
    lag_ax.set_ylabel("healthy delivery lag p99 (s)")
    lag_ax.legend(fontsize=8)
    slow_ax.set_ylabel("calls open to slow and hanging endpoints")
    slow_ax.set_xticks(range(len(names)), names, rotation=20, ha="right", fontsize=8)
    slow_ax.legend(fontsize=8)
    fig.suptitle(
        f"{cfg.endpoints} endpoints, {cfg.rate:g} healthy events/s; slow ones answer after {cfg.slow_delay:g} s"
        f" ({cfg.slow_rate:g} events/s each)"
    )
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=90)
    plt.close(fig)


def worker_settings(pairs: list[str]) -> dict[str, str]:
    """NAME=VALUE pairs (NAME with or without HOOKLANE_), checked."""
    out = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        name = name.strip().upper().removeprefix("HOOKLANE_")
        if not sep or not name or not name.replace("_", "").isalnum():
            raise SystemExit(f"--worker-setting must be NAME=VALUE, not {pair!r}")
        out[name] = value
    return out


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.phase_seconds:
        cfg = replace(cfg, phase_seconds=args.phase_seconds)
    settings = worker_settings(args.worker_setting or [])
    try:
        budget = args.fair_budget or int(settings.get("WORKER_LONG_CALLS", cfg.worker_concurrency))
    except ValueError:
        raise SystemExit("--worker-setting WORKER_LONG_CALLS must be a whole number") from None
    workers = [("before", args.before_tree)] if args.before_tree else []
    workers.append(("after", None))
    procs, receivers = start_receivers(cfg.receivers, cfg.slow_delay)
    runs = []
    try:
        await wait_receivers(receivers)
        with postgres_server(args.dsn) as server:
            for label, tree in workers:
                run = await run_worker(server, label, tree, cfg, receivers, settings, budget)
                runs.append({**run, "tree": str(tree or REPO)})
                print(table([runs[-1]]), flush=True)
    finally:
        for p in procs:
            stop_process(p)
    if args.plot_dir:
        plot(runs, cfg, Path(args.plot_dir) / f"incident-correlated-{args.preset}.png")
    return {
        "preset": args.preset,
        "mode": "correlated",
        "config": asdict(cfg),
        "phases": [asdict(p) for p in PHASES],
        "machine": machine(),
        "table": table(runs),
        "runs": runs,
    }


def main() -> None:
    """``create DSN ROWS_FILE``: the endpoints, by the tree on sys.path."""
    if sys.argv[1:2] == ["create"]:
        asyncio.run(create_endpoints_async(sys.argv[2], json.loads(Path(sys.argv[3]).read_text())))


if __name__ == "__main__":
    main()

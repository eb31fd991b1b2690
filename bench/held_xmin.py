"""The cost of a held xmin horizon, bucket by bucket (issue 21).

An application sharing Hooklane's database holds a snapshot open (a
REPEATABLE READ report, a session idle in transaction, a pg_dump): from then
on no dead row the queue makes can be removed, and PostgreSQL's CPU per
delivery and the delivery latency grow for as long as it is held.

One run, per tree: a fresh database (a new one on the same private server
for every tree, dropped after it; the trees run one after the other), its
tables holding ``history`` delivered events first (then VACUUM ANALYZE, as
bench/steady.py does, so that kept plans are made on a deployment's tables),
N endpoints on one aiohttp receiver that answers 204 at once, one ``hooklane
worker`` with its defaults, and bench/steady.py's publisher process: a fixed
open-loop rate, one ``hooklane.publish`` per transaction, round robin over
the endpoints. After a short unmeasured warm-up, two phases back to back
while publishing goes on at the same rate:

- ``control``: nothing else happens;
- ``held``: a separate connection runs ``BEGIN ISOLATION LEVEL REPEATABLE
  READ; SELECT count(*) FROM events`` (the select takes the snapshot) and
  keeps the transaction open until the phase ends, then rolls back. That its
  ``backend_xmin`` is set is checked (and printed) at both ends of the phase.

Per bucket of each phase: deliveries/s arrived at the receiver; CPU of every
process of the PostgreSQL server (postmaster, backends, autovacuum, exited
children) and of the worker, per delivery and as cores; reservation rounds/s;
publish-to-receiver latency (commit returned to arrival) of the events whose
commit returned in the bucket; and each bucket's PostgreSQL CPU per delivery
and p99 over the control phase's mean of them. The issue's target is every
held bucket within 1.5x of control on both. At the start and the end of each
phase: live and dead rows, autovacuum runs and sizes of every user table
(pg_stat_user_tables, whatever tables the tree has); the dead rows also at
every bucket's end. Dead rows are the statistics' ``n_dead_tup``: what
pruning and autovacuum have not removed, as of about a second ago.

``--tree DIR`` runs the worker, the publisher and the migrations from another
source tree; ``--compare DIR`` runs a second tree after the first. Results go
to ``--out`` as JSON (with the machine), and a markdown table to stdout.

Run: ``python -m bench.held_xmin [--tree ../before] [--compare .] [--held-seconds 900]``
(about 11 minutes a tree with the defaults; ``--preset smoke``, about one).

``--reads`` measures instead what the operators' reads cost while the
snapshot is held (issue 37), with no worker: N endpoints, a few of them
with pending deliveries, then, with the snapshot held, deliveries sent in
steps as a worker sends them (pending, in flight, delivered: three versions
each, by SQL, round robin over the endpoints). Before the hold and after
each step: the admin listing's statement (``endpoint_page``, the first page
of 50) and the dashboard's totals (``endpoint_totals``), each without a
gauge pass's counts (every queue read from its start, as before migration
0017 or with no worker running) and with those of one pass
(``queue_summaries``); and the worker's gauges statement
(``endpoint_health`` over every partition with the floors of the
endpoints that have pending deliveries), as it read before (``listed``
false: an endpoint outside the floors from the start of its queue) and as
the gauge job reads now, side by side; the median of three runs each, and
the buffers of its plan.
``--preset smoke`` runs it small in seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import bisect
import datetime
import itertools
import json
import math
import statistics
import subprocess
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil

from bench.common import (
    DOCS,
    REPO,
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
from bench.steady import (
    EVENT_TYPE,
    HISTORY_DELIVERIES,
    HISTORY_EVENTS,
    _ms,
    describe,
    first_arrivals,
    sleep_until,
    snapshot,
)
from bench.throughput import postgres_pids, receiver
from hooklane import store
from hooklane.store.endpoints import EndpointFilter
from hooklane.store.queries import QUERIES

TARGET = 1.5  # the issue's: a held bucket within this of control's mean


@dataclass(frozen=True)
class Config:
    endpoints: int = 100
    rate: float = 200.0  # events/s
    control: float = 300.0  # seconds
    held: float = 300.0
    bucket: float = 60.0
    warmup: float = 10.0  # publishing before control opens, not measured
    tail: float = 2.0  # publishing after held closes, so that its last bucket ends as steady
    publishers: int = 8  # publishing connections
    history: int = 50_000  # delivered events in the tables before the worker starts
    drain_timeout: float = 120.0  # after publishing, for the last deliveries to arrive


PRESETS = {
    "full": Config(),
    "smoke": Config(
        endpoints=20, rate=50, control=20, held=20, bucket=10, warmup=2, publishers=2, history=1_000
    ),
}


@dataclass(frozen=True)
class ReadsConfig:
    endpoints: int = 10_000
    pending: int = 500  # endpoints with a pending delivery, as a worker's ready list holds them
    steps: int = 4
    sent_per_step: int = 100_000  # deliveries sent (three versions each) per step while held
    batch: int = 10_000
    repeats: int = 3


READS_PRESETS = {
    "full": ReadsConfig(),
    "smoke": ReadsConfig(endpoints=200, pending=20, steps=2, sent_per_step=2_000, batch=1_000),
}

TABLES = """
SELECT relname, n_live_tup, n_dead_tup, n_tup_ins, n_tup_upd, n_tup_hot_upd, n_tup_del,
       last_autovacuum, autovacuum_count, last_autoanalyze, autoanalyze_count,
       pg_table_size(relid) AS table_bytes, pg_indexes_size(relid) AS index_bytes
FROM pg_stat_user_tables ORDER BY relname
"""
SETTINGS = ("server_version", "port", "synchronous_commit", "fsync", "autovacuum", "autovacuum_naptime")
HELD = """
SELECT backend_xmin::text AS backend_xmin, age(backend_xmin) AS xmin_age, state
FROM pg_stat_activity WHERE pid = $1
"""


# --------------------------------------------------------------------------
# Measuring (I/O)


async def table_stats(conn: asyncpg.Connection) -> list[dict]:
    """Every user table's row counts, autovacuum runs and sizes, from a
    fresh snapshot of the statistics (a session's last second may not be
    in them yet)."""
    await conn.execute("SELECT pg_stat_clear_snapshot()")
    return [dict(r) for r in await conn.fetch(TABLES)]


def phase_edges(opened: float, start: float, seconds: float, bucket: float) -> list[float]:
    """The wall times that bound a phase's buckets: ``opened`` (at or just
    after ``start``), then every ``bucket`` from ``start``, the last bucket
    shorter if need be."""
    n = max(1, math.ceil(seconds / bucket - 1e-9))
    return [opened, *(start + min(i * bucket, seconds) for i in range(1, n + 1))]


@dataclass
class Probe:
    """What the driver reads while the run goes on: CPU of the worker and of
    the PostgreSQL server, the worker's reservation rounds, the tables'
    statistics; and whether the processes are still running."""

    conn: asyncpg.Connection
    groups: dict[str, list[psutil.Process]]
    metrics_port: int
    procs: dict[str, subprocess.Popen]

    async def tables(self) -> list[dict]:
        return await table_stats(self.conn)

    async def phase(self, start: float, seconds: float, bucket: float) -> list[dict]:
        """A mark (CPU, rounds, dead rows per table) now, then at the end of
        each bucket. The dead rows are read after the CPU, so that reading
        them costs the next bucket, not this one."""
        marks = []
        for i, edge in enumerate(phase_edges(time.time(), start, seconds, bucket)):
            if i:
                await sleep_until(edge)
            for name, proc in self.procs.items():
                if proc.poll() is not None:
                    raise RuntimeError(f"the {name} exited ({proc.returncode}) during the run")
            mark = snapshot(self.groups, self.metrics_port)
            mark["dead_rows"] = {t["relname"]: t["n_dead_tup"] for t in await self.tables()}
            marks.append(mark)
        return marks


async def open_held(dsn: str) -> tuple[asyncpg.Connection, int]:
    """A session holding a snapshot until rolled back: the select is what
    takes it. Returns the session and the rows its snapshot counted."""
    held = await asyncpg.connect(dsn)
    try:
        await held.execute("BEGIN ISOLATION LEVEL REPEATABLE READ")
        counted = await held.fetchval("SELECT count(*) FROM events")
    except BaseException:
        await held.close()
        raise
    return held, counted


async def close_held(held: asyncpg.Connection) -> None:
    try:
        if held.is_in_transaction():
            await held.execute("ROLLBACK")
    finally:
        await held.close()


async def held_state(conn: asyncpg.Connection, held: asyncpg.Connection) -> dict:
    """The held session as the server sees it; refuses one that does not
    pin the horizon, since the run would then measure nothing."""
    pid = held.get_server_pid()
    row = await conn.fetchrow(HELD, pid)
    if row is None or row["backend_xmin"] is None:
        raise RuntimeError(f"the held session (pid {pid}) does not hold back the horizon: {row}")
    return {"pid": pid, **dict(row), "at": time.time()}


async def phases(dsn: str, probe: Probe, cfg: Config, start: float, label: str) -> dict:
    """Control, then held, back to back from ``start`` + warm-up: each
    phase's marks, the tables at both ends of each, the held session."""
    control_at = start + cfg.warmup
    held_at = control_at + cfg.control
    await sleep_until(control_at)
    tables = {"control_start": await probe.tables()}
    control = await probe.phase(control_at, cfg.control, cfg.bucket)
    tables["control_end"] = await probe.tables()
    held, counted = await open_held(dsn)
    try:
        pinned: dict[str, Any] = {"events_counted": counted, "start": await held_state(probe.conn, held)}
        print(
            f"{label}: held session pid {pinned['start']['pid']}, backend_xmin "
            f"{pinned['start']['backend_xmin']} ({pinned['start']['state']}), {counted} events counted",
            flush=True,
        )
        tables["held_start"] = await probe.tables()
        held_marks = await probe.phase(held_at, cfg.held, cfg.bucket)
        pinned["end"] = await held_state(probe.conn, held)
        tables["held_end"] = await probe.tables()
    finally:
        await close_held(held)
    if pinned["end"]["backend_xmin"] != pinned["start"]["backend_xmin"]:
        raise RuntimeError(f"the held snapshot moved: {pinned}")
    print(
        f"{label}: held to the end: backend_xmin {pinned['end']['backend_xmin']} "
        f"(age {pinned['end']['xmin_age']} xids, {pinned['end']['state']}), then rolled back",
        flush=True,
    )
    return {"marks": {"control": control, "held": held_marks}, "tables": tables, "held_session": pinned}


async def wait_arrived(http: aiohttp.ClientSession, base: str, numbers: set[int], timeout: float) -> dict:
    """The receiver's stats once every published event has arrived, or
    after ``timeout``. Asks the receiver rather than the database, so that
    it holds whatever tables a tree has."""
    deadline = time.monotonic() + timeout
    while True:
        stats = await (await http.get(f"{base}/_stats")).json()
        if numbers <= first_arrivals(stats).keys() or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(2)


# --------------------------------------------------------------------------
# Figures (pure)


def analyse_phase(name: str, marks: list[dict], events: list[list[float]], stats: dict) -> list[dict]:
    """One row per bucket between consecutive marks, from the publisher's
    times (event number, due, transaction start, commit returned) and the
    receiver's arrivals. A delivery counts in the bucket it arrived in; a
    latency in the bucket its commit returned in."""
    arrivals = sorted(at for at, _lag, _slow in stats["arrivals"])
    arrived = first_arrivals(stats)
    starts = [m["at"] for m in marks]
    committed: list[list[list[float]]] = [[] for _ in marks[1:]]
    for event in events:
        i = bisect.bisect_right(starts, event[3]) - 1
        if 0 <= i < len(committed):
            committed[i].append(event)
    phase_start = marks[0]["at"]
    rows = []
    for i, (a, b) in enumerate(itertools.pairwise(marks)):
        wall = b["at"] - a["at"]
        count = bisect.bisect_left(arrivals, b["at"]) - bisect.bisect_left(arrivals, a["at"])
        cpu = {k: b["cpu"][k] - a["cpu"][k] for k in b["cpu"]}
        mine = committed[i]
        rows.append(
            {
                "phase": name,
                "bucket": i,
                "from_s": round(a["at"] - phase_start, 3),
                "to_s": round(b["at"] - phase_start, 3),
                "seconds": round(wall, 3),
                "deliveries": count,
                "deliveries_per_s": count / wall,
                "cpu_seconds": {k: round(v, 3) for k, v in cpu.items()},
                "pg_ms_per_delivery": 1000 * cpu["postgres"] / count if count else None,
                "pg_cores": cpu["postgres"] / wall,
                "worker_ms_per_delivery": 1000 * cpu["worker"] / count if count else None,
                "worker_cores": cpu["worker"] / wall,
                "reservation_rounds_per_s": (b["rounds"] - a["rounds"]) / wall,
                "published": len(mine),
                "undelivered": sum(1 for e in mine if int(e[0]) not in arrived),
                "latency_ms": _ms(
                    summary([arrived[int(n)] - c for n, _d, _s, c in mine if int(n) in arrived])
                ),
                "publish_transaction_ms": _ms(summary([c - s for _n, _d, s, c in mine])),
                "publisher_late_ms": _ms(summary([max(0.0, s - d) for _n, d, s, _c in mine])),
                "dead_rows": b["dead_rows"],
                "dead_rows_total": sum(b["dead_rows"].values()),
            }
        )
    return rows


RATIOS = {
    "pg_ms_per_delivery": lambda b: b["pg_ms_per_delivery"],
    "p99": lambda b: b["latency_ms"]["p99"],
}


def with_ratios(control: list[dict], held: list[dict]) -> dict:
    """Each bucket's PostgreSQL CPU per delivery and p99 over the control
    phase's mean of them (added to the buckets); the verdict on the held
    phase against TARGET."""

    def usable(v: float | None) -> bool:
        return v is not None and not math.isnan(v)

    means = {}
    for key, f in RATIOS.items():
        values = [f(b) for b in control if usable(f(b))]
        means[key] = statistics.mean(values) if values else None
    for b in [*control, *held]:
        b["ratio"] = {k: f(b) / means[k] if usable(f(b)) and means[k] else None for k, f in RATIOS.items()}
    worst = {k: max((b["ratio"][k] for b in held if b["ratio"][k] is not None), default=None) for k in RATIOS}
    return {
        "control_mean": means,
        "held_worst_ratio": worst,
        "target": TARGET,
        # A bucket without a figure (no delivery arrived) fails the target.
        "within_target": {
            k: bool(held) and all(b["ratio"][k] is not None and b["ratio"][k] <= TARGET for b in held)
            for k in RATIOS
        },
    }


# --------------------------------------------------------------------------
# One tree


async def write_history(conn: asyncpg.Connection, cfg: Config) -> None:
    """bench/steady.py's history: delivered events from before the run,
    then VACUUM ANALYZE, so that the worker's kept plans are made on the
    tables of a running deployment rather than on empty ones."""
    await conn.execute(HISTORY_EVENTS, cfg.history, cfg.endpoints, EVENT_TYPE)
    await conn.execute(HISTORY_DELIVERIES)
    await conn.execute("VACUUM ANALYZE")


def intended(reported: str, tree: Path | None) -> None:
    """The publisher imported hooklane from the tree under test, not from
    wherever the editable install points."""
    root = (tree or REPO).resolve()
    if not Path(reported).resolve().is_relative_to(root):
        raise RuntimeError(f"the publisher imported {reported}, not hooklane from {root}")


def start_publisher(dsn: str, base: str, cfg: Config, tree: Path | None, out: Path) -> subprocess.Popen:
    """bench/steady.py's publisher, for the warm-up, both phases and the tail."""
    seconds = cfg.warmup + cfg.control + cfg.held + cfg.tail
    return start_module(
        "bench.steady",
        "publish",
        *("--dsn", dsn, "--base", base, "--endpoints", str(cfg.endpoints)),
        *("--rate", str(cfg.rate), "--seconds", str(seconds)),
        *("--connections", str(cfg.publishers), "--out", str(out)),
        tree=tree,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )


async def run_tree(server_dsn: str, base: str, cfg: Config, tree: Path | None, label: str) -> dict:
    async with fresh_database(server_dsn, "held_xmin", tree=tree) as dsn:
        with tempfile.TemporaryDirectory(prefix="hooklane-held-xmin-") as tmp:
            out = Path(tmp) / "events.json"
            publisher = start_publisher(dsn, base, cfg, tree, out)
            metrics_port = free_ports(1)[0]
            worker = None
            conn = None
            try:
                assert publisher.stdin is not None and publisher.stdout is not None  # both PIPE
                line = await asyncio.wait_for(asyncio.to_thread(publisher.stdout.readline), 120)
                if not line:
                    raise RuntimeError("the publisher exited before it was ready")
                ready = json.loads(line)
                intended(ready["hooklane"], tree)
                print(f"{label}: publisher imports {ready['hooklane']}", flush=True)
                conn = await asyncpg.connect(dsn)
                await write_history(conn, cfg)
                worker = start_worker(
                    dsn, tree=tree, metrics_port=str(metrics_port), metrics_host="127.0.0.1"
                )
                await wait_workers_ready(dsn, 1)
                settings = {k: await conn.fetchval(f"SHOW {k}") for k in SETTINGS}
                master = psutil.Process(postgres_pids(int(settings["port"]))[0])
                probe = Probe(
                    conn,
                    {"worker": [psutil.Process(worker.pid)], "postgres": [master]},
                    metrics_port,
                    {"publisher": publisher, "worker": worker},
                )
                async with aiohttp.ClientSession() as http:
                    await http.post(f"{base}/_reset")
                    start = time.time() + 0.5
                    publisher.stdin.write(f"{start!r}\n")
                    publisher.stdin.flush()
                    measured = await phases(dsn, probe, cfg, start, label)
                    await asyncio.to_thread(publisher.wait, cfg.tail + cfg.drain_timeout)
                    if publisher.returncode != 0:
                        raise RuntimeError("the publisher failed")
                    events = json.loads(out.read_text())
                    stats = await wait_arrived(http, base, {int(e[0]) for e in events}, cfg.drain_timeout)
            finally:
                if conn is not None:
                    await conn.close()
                if worker is not None:
                    stop_process(worker, grace=1.0)
                stop_process(publisher, grace=1.0)
    arrived = first_arrivals(stats)
    marks = measured["marks"]
    control = analyse_phase("control", marks["control"], events, stats)
    held = analyse_phase("held", marks["held"], events, stats)
    return {
        "tree": label,
        "hooklane": ready["hooklane"],
        "postgres_settings": settings,
        "published": len(events),
        "delivered": sum(1 for e in events if int(e[0]) in arrived),
        "verdict": with_ratios(control, held),
        "buckets": [*control, *held],
        **measured,
    }


# --------------------------------------------------------------------------
# The report


def _f(v: float | None, spec: str = ".3g") -> str:
    return "-" if v is None or (isinstance(v, float) and math.isnan(v)) else format(v, spec)


def bucket_table(runs: list[dict]) -> str:
    head = (
        "| tree | phase | bucket s | del/s | PG ms/del | PG cores | worker ms/del | worker cores "
        "| p50 ms | p99 ms | PG/del vs ctl | p99 vs ctl | dead rows | undelivered |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for run in runs:
        for b in run["buckets"]:
            cells = [
                run["tree"],
                b["phase"],
                f"{b['from_s']:.0f}-{b['to_s']:.0f}",
                _f(b["deliveries_per_s"], ".1f"),
                _f(b["pg_ms_per_delivery"], ".3f"),
                _f(b["pg_cores"], ".3f"),
                _f(b["worker_ms_per_delivery"], ".3f"),
                _f(b["worker_cores"], ".3f"),
                _f(b["latency_ms"]["p50"], ".1f"),
                _f(b["latency_ms"]["p99"], ".1f"),
                _f(b["ratio"]["pg_ms_per_delivery"], ".2f") + "x",
                _f(b["ratio"]["p99"], ".2f") + "x",
                f"{b['dead_rows_total']:,}",
                str(b["undelivered"]),
            ]
            lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def dead_row_table(runs: list[dict]) -> str:
    head = (
        "| tree | at | table | live rows | dead rows | autovacuums | last autovacuum | autoanalyzes "
        "| table MB | index MB |"
    )
    lines = [head, "|" + "---|" * head.count(" | ") + "---|"]
    for run in runs:
        opened = run["marks"]["control"][0]["at"]
        for at in ("control_end", "held_end"):
            for t in run["tables"][at]:
                last = t["last_autovacuum"]
                when = f"control +{last.timestamp() - opened:.0f} s" if last is not None else "never"
                cells = [
                    run["tree"],
                    at.replace("_", " "),
                    t["relname"],
                    f"{t['n_live_tup']:,}",
                    f"{t['n_dead_tup']:,}",
                    str(t["autovacuum_count"]),
                    when,
                    str(t["autoanalyze_count"]),
                    f"{t['table_bytes'] / 2**20:.1f}",
                    f"{t['index_bytes'] / 2**20:.1f}",
                ]
                lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verdict_line(run: dict) -> str:
    v = run["verdict"]
    within = v["within_target"]
    worst = v["held_worst_ratio"]
    ok = "MET" if all(within.values()) else "MISSED"
    return (
        f"{run['tree']}: every held bucket within {TARGET}x of control: {ok} "
        f"(PG CPU/delivery {'yes' if within['pg_ms_per_delivery'] else 'no'}, worst "
        f"{_f(worst['pg_ms_per_delivery'], '.2f')}x; p99 {'yes' if within['p99'] else 'no'}, worst "
        f"{_f(worst['p99'], '.2f')}x); {run['published'] - run['delivered']} of {run['published']} undelivered"
    )


# --------------------------------------------------------------------------
# --reads: the listing and the gauges under a held snapshot


async def send_deliveries(
    conn: asyncpg.Connection, ids: list[int], first: int, count: int, batch: int
) -> None:
    """``count`` deliveries sent as a worker sends them, round robin over
    the endpoints: published pending, reserved (a lease that has since
    ended), delivered."""
    for start in range(first, first + count, batch):
        end = min(start + batch, first + count) - 1
        await conn.execute(
            "INSERT INTO events (tenant, id, type, data, fanout)"
            " SELECT 'bench', 's' || i, $3, '{}', 1 FROM generate_series($1::int, $2::int) i",
            start,
            end,
            EVENT_TYPE,
        )
        await conn.execute(
            "INSERT INTO deliveries (endpoint_id, event_tenant, event_id)"
            " SELECT ($3::bigint[])[1 + i % cardinality($3::bigint[])], 'bench', 's' || i"
            " FROM generate_series($1::int, $2::int) i",
            start,
            end,
            ids,
        )
        sent = "event_id = ANY(SELECT 's' || i FROM generate_series($1::int, $2::int) i)"
        await conn.execute(
            "UPDATE deliveries SET state = 'sending', attempts = 1, reserved_at = now(),"
            f" lease_expires_at = now() - interval '1 second' WHERE {sent}",
            start,
            end,
        )
        await conn.execute(
            "UPDATE deliveries SET state = 'delivered', delivered_at = now(), lease_expires_at = NULL,"
            f" last_status = 204 WHERE {sent}",
            start,
            end,
        )


async def timed_read(conn: asyncpg.Connection, statement: str, repeats: int, **params: Any) -> dict:
    """The median wall time of ``statement`` over ``repeats`` runs (its rows
    decoded included), and the server's execution time and the shared
    buffers of its plan (EXPLAIN ANALYZE, BUFFERS)."""
    sql, *args = QUERIES[statement](**params)
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        await conn.fetch(sql, *args)
        times.append(time.perf_counter() - started)
    (plan,) = json.loads(await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + sql, *args))
    top = plan["Plan"]
    return {
        "ms": 1000 * statistics.median(times),
        "server_ms": plan["Execution Time"],
        "buffers": top["Shared Hit Blocks"] + top["Shared Read Blocks"],
    }


async def reads(conn: asyncpg.Connection, cfg: ReadsConfig, floors: dict[int, datetime.datetime]) -> dict:
    listing = {
        **EndpointFilter().parameters(),
        "cursor_oldest_pending_at": None,
        "cursor_namespace": None,
        "cursor_name": None,
        "limit": 51,
    }
    gauges = {"partitions": None, "namespace": None, "name": None}
    gauges |= {"floor_ids": list(floors), "floors": list(floors.values())}
    # The listings without a gauge pass's counts (no worker, or before
    # migration 0017), then with those of one pass, as a worker keeps them.
    await conn.execute("DELETE FROM queue_summaries")
    found = {
        "listing_before": await timed_read(conn, "endpoint_page", cfg.repeats, **listing),
        "totals_before": await timed_read(
            conn, "endpoint_totals", cfg.repeats, **EndpointFilter().parameters()
        ),
        "gauges_before": await timed_read(conn, "endpoint_health", cfg.repeats, **gauges, listed=False),
        "gauges_after": await timed_read(conn, "endpoint_health", cfg.repeats, **gauges, listed=True),
    }
    partitions = list(range(await conn.fetchval(*QUERIES["partition_count"]())))
    healths = await store.endpoint_health(conn, partitions, floors=floors, listed=True)
    await store.write_queue_summaries(conn, partitions, healths, fresh_seconds=3600)
    found["listing_after"] = await timed_read(conn, "endpoint_page", cfg.repeats, **listing)
    found["totals_after"] = await timed_read(
        conn, "endpoint_totals", cfg.repeats, **EndpointFilter().parameters()
    )
    return found


async def run_reads(server_dsn: str, cfg: ReadsConfig) -> dict:
    """The reads before the hold and after each step of sending while held."""
    async with fresh_database(server_dsn, "held_reads") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            await conn.execute(
                "INSERT INTO endpoints (namespace, name, url, tenant, partition, secret)"
                " SELECT 'bench', 'ep-' || i, 'http://127.0.0.1:9/', 'bench', i % $2, 'x'"
                " FROM generate_series(1, $1::int) i",
                cfg.endpoints,
                await conn.fetchval(*QUERIES["partition_count"]()),
            )
            ids = [r["id"] for r in await conn.fetch("SELECT id FROM endpoints ORDER BY id")]
            await send_deliveries(conn, ids, 0, cfg.batch, cfg.batch)
            await conn.execute(
                "INSERT INTO events (tenant, id, type, data, fanout)"
                " SELECT 'bench', 'p' || i, $2, '{}', 1 FROM generate_series(1, $1::int) i",
                cfg.pending,
                EVENT_TYPE,
            )
            await conn.execute(
                "INSERT INTO deliveries (endpoint_id, event_tenant, event_id)"
                " SELECT ($2::bigint[])[i], 'bench', 'p' || i FROM generate_series(1, $1::int) i",
                cfg.pending,
                ids,
            )
            await conn.execute("VACUUM ANALYZE")
            # The ready list's floors: each pending endpoint's head.
            floors = {
                r["endpoint_id"]: r["head"]
                for r in await conn.fetch(
                    "SELECT endpoint_id, min(next_attempt_at) AS head FROM deliveries"
                    " WHERE state = 'pending' GROUP BY endpoint_id"
                )
            }
            rows = [{"sent_while_held": 0, **await reads(conn, cfg, floors)}]
            held, _ = await open_held(dsn)
            try:
                for step in range(1, cfg.steps + 1):
                    await send_deliveries(conn, ids, step * cfg.sent_per_step, cfg.sent_per_step, cfg.batch)
                    await held_state(conn, held)
                    row = {"sent_while_held": step * cfg.sent_per_step}
                    rows.append({**row, **await reads(conn, cfg, floors)})
                    print(reads_line(rows[-1]), flush=True)
            finally:
                await close_held(held)
        finally:
            await conn.close()
    return {"config": asdict(cfg), "rows": rows}


READS = ("listing_before", "listing_after", "totals_before", "totals_after", "gauges_before", "gauges_after")


def reads_line(row: dict) -> str:
    # Each delivery sent leaves two dead versions: pending and in flight.
    cells = [f"{row['sent_while_held']:,}", f"{2 * row['sent_while_held']:,}"]
    for key in READS:
        cells += [f"{row[key]['server_ms']:.1f}", f"{row[key]['buffers']:,}"]
    return "| " + " | ".join(cells) + " |"


def reads_table(rows: list[dict]) -> str:
    head = "| sent while held | dead versions | " + " | ".join(
        f"{key.replace('_', ' ')} server ms | buffers" for key in READS
    )
    return "\n".join([head + " |", "|" + " --- |" * (2 + 2 * len(READS)), *map(reads_line, rows)])


async def main_async(args: argparse.Namespace) -> dict:
    if args.reads:
        cfg_reads = READS_PRESETS[args.preset]
        if args.endpoints is not None:
            cfg_reads = replace(cfg_reads, endpoints=args.endpoints)
        with postgres_server(args.dsn) as server:
            result = await run_reads(server, cfg_reads)
        print()
        print(reads_table(result["rows"]))
        return {"preset": args.preset, "mode": "reads", "machine": machine(), **result}
    cfg = PRESETS[args.preset]
    overrides = {
        "endpoints": args.endpoints,
        "rate": args.rate,
        "control": args.control_seconds,
        "held": args.held_seconds,
        "bucket": args.bucket,
        "history": args.history,
    }
    cfg = replace(cfg, **{k: v for k, v in overrides.items() if v is not None})
    trees = [args.tree, *([args.compare] if args.compare else [])]
    labels = [describe(t) for t in trees]
    runs = []
    with receiver("aiohttp") as (base, _pids, _kind), postgres_server(args.dsn) as server:
        for tree, label in zip(trees, labels, strict=True):
            run = await run_tree(server, base, cfg, tree, label)
            print(verdict_line(run), flush=True)
            runs.append(run)
    print()
    print(bucket_table(runs))
    print()
    print(dead_row_table(runs))
    print()
    for run in runs:
        print(verdict_line(run))
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "trees": labels,
        "verdict": {run["tree"]: run["verdict"] for run in runs},
        "runs": runs,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="CPU and latency per bucket while a snapshot is held")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    parser.add_argument("--endpoints", type=int, help="endpoints, overriding the preset")
    parser.add_argument("--rate", type=float, help="events/s, overriding the preset")
    parser.add_argument("--control-seconds", type=float, help="the control phase, overriding the preset")
    parser.add_argument("--held-seconds", type=float, help="the held phase, overriding the preset")
    parser.add_argument("--bucket", type=float, help="seconds per bucket, overriding the preset")
    parser.add_argument("--history", type=int, help="delivered events before the run, overriding the preset")
    parser.add_argument(
        "--tree", type=Path, help="run worker, publisher and migrations from this source tree"
    )
    parser.add_argument("--compare", type=Path, help="a second source tree, run after the first")
    parser.add_argument(
        "--reads", action="store_true", help="time the admin listing and the gauges while held, no worker"
    )
    parser.add_argument(
        "--out",
        "--json",
        dest="json",
        help="write the results here (default: docs/bench-results/held_xmin-<date>.json; "
        "the smoke preset writes none unless asked)",
    )
    args = parser.parse_args()
    for name in ("tree", "compare"):
        if getattr(args, name) is not None:
            setattr(args, name, getattr(args, name).resolve())
    if args.json is None and args.preset != "smoke":
        mode = "held_xmin-reads" if args.reads else "held_xmin"
        args.json = str(DOCS / "bench-results" / f"{mode}-{datetime.date.today().isoformat()}.json")
    run_and_report(main_async, args, lambda result: result["rows"][-1] if args.reads else result["verdict"])


if __name__ == "__main__":
    main()

"""Tenants at scale (issue 25): what a tenant session costs a request, what
the portal's endpoints page costs, and what the notifications pass costs,
as the number of endpoints grows; every size side by side in one run.

One database per size of ``sizes`` (endpoints), all on one server, seeded
by bulk INSERT as the workers would leave them, then analysed: endpoints
of tenants of 100 each (``t1`` is the one measured) and a tenant ``big``
holding a tenth of them, ``deliveries`` per endpoint (most delivered, the
newest few pending on a fifth of the endpoints, three dead on a tenth),
and an attempt for each delivery that was tried, all older than the
notifications pass looks back. In ``full`` one more database of the
largest size also holds ``history`` attempts over ``history_days`` daily
partitions (a hundredth of them dead): whether the pass's cost follows the
history.

1. **Sessions** (``api``): a ``hooklane api`` per database. The same
   listing through the admin API (admin token, checked in memory) and the
   tenant API (a tenant token: the session looked up by its digest, then
   the endpoint's tenant checked in a repeatable-read transaction):
   one endpoint's deliveries (``/endpoints/{ns}/{name}/deliveries``) and
   the tenant's endpoints page (``/endpoints``, ``?tenant=t1`` for the
   admin). ``clients`` requests in flight from this process for a window of
   ``seconds`` after ``warmup``; each round runs every variant at every
   size once, admin and tenant next to each other, the first alternating.
   Per window: requests/s, p50 and p99, and CPU per request of PostgreSQL
   (every process of the server: bench/steady.py's sampler) and of the API
   process. Medians over the rounds, and tenant over admin.
2. **Portal** (``portal``): ``GET /portal`` with a session cookie, for
   ``t1`` and for ``big``, one request at a time, every size in turn: time,
   PostgreSQL CPU and bytes; and the plans of its two statements.
3. **Notifications** (``notifications``): the pass itself
   (``Notifications.run_once``, as the worker's maintenance runs it) on
   each database, timed with PostgreSQL's CPU, in four states, ``passes``
   times each, the databases in turn: ``steady`` (nothing new since the
   last pass), ``openings`` (``openings`` circuits opened since),
   ``dead`` (``dead_endpoints`` endpoints with ``dead_per_endpoint`` dead
   attempts each since) and ``all_open`` (every circuit open, each opening
   noticed and told already). Each pass follows an untimed one, so that its
   window starts where a worker's would; what a pass noted and published is
   checked. Then, in each state, one more pass rolled back twice: the plans
   of ``note_notices`` and ``take_notices`` (EXPLAIN ANALYZE: time,
   buffers, and the scans that returned the most rows), and the time of
   each step (note, take, publish).

Run: ``python -m bench.tenants --preset full --json docs/bench-results/tenants.json``
(``--dsn``: a server of this machine to create the databases on.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import subprocess
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta

import aiohttp
import asyncpg
import psutil

from bench.common import (
    REPO,
    SECRET,
    free_ports,
    fresh_database,
    machine,
    percentile,
    postgres_server,
    python_module,
    run_and_report,
    stop_process,
)
from bench.publish_function import Server, own_cpu
from bench.steady import cpu_seconds
from hooklane import store
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec
from hooklane.store import grants
from hooklane.store.queries import QUERIES
from hooklane.worker.notifications import (
    BATCH,
    LOOKBACK_SECONDS,
    SETTLE_SECONDS,
    Notifications,
    Notified,
    notice_event,
)

ADMIN_TOKEN = "bench-tenants-admin-token-0123456789"
TENANT = "t1"  # 100 endpoints at every size
BIG = "big"  # a tenth of the endpoints
OPS = "ops"  # the notifications tenant
PER_TENANT = 100


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]  # endpoints of each database
    deliveries: int  # per endpoint
    history: int  # attempts over history_days, in one more database of the largest size (0: none)
    history_days: int
    rounds: int  # windows of each API variant
    warmup: float
    seconds: float
    clients: int  # requests in flight
    page_runs: int  # portal pages per size and tenant
    openings: int  # circuits opened before a pass
    dead_endpoints: int  # endpoints with dead attempts before a pass
    dead_per_endpoint: int
    passes: int  # timed passes per state and database


PRESETS = {
    "full": Config(
        sizes=(1_000, 10_000),
        deliveries=30,
        history=5_000_000,
        history_days=7,
        rounds=5,
        warmup=1.0,
        seconds=4.0,
        clients=8,
        page_runs=40,
        openings=100,
        dead_endpoints=200,
        dead_per_endpoint=50,
        passes=7,
    ),
    "quick": Config(
        sizes=(1_000, 10_000),
        deliveries=10,
        history=500_000,
        history_days=3,
        rounds=2,
        warmup=0.5,
        seconds=2.0,
        clients=8,
        page_runs=6,
        openings=100,
        dead_endpoints=200,
        dead_per_endpoint=20,
        passes=3,
    ),
    "smoke": Config(
        sizes=(200, 1_000),
        deliveries=5,
        history=20_000,
        history_days=2,
        rounds=1,
        warmup=0.2,
        seconds=0.5,
        clients=4,
        page_runs=2,
        openings=20,
        dead_endpoints=20,
        dead_per_endpoint=5,
        passes=2,
    ),
}


# --------------------------------------------------------------------------
# Seeding

# Endpoint i: of tenant `big` when i % 10 = 0, else of t<i % (E/100>: 100
# endpoints each. $1: endpoints, $2: E/100, $3: the secret.
ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
SELECT 'ns-' || (i % 20), 'ep-' || i,
       CASE WHEN i % 10 = 0 THEN 'big' ELSE 't' || (i % $2) END,
       'https://receiver.example/' || i, $3,
       (hashtext('ns-' || (i % 20) || '/ep-' || i)::bigint & 2147483647)
         % (SELECT partition_count FROM hooklane_config)
FROM generate_series(0, $1 - 1) AS i
"""
# One event per tenant and delivery slot; everything 20 minutes old or more,
# before the notifications pass's lookback.
EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout, created_at)
SELECT 'ev-' || n, t.tenant, 'order.created', '{"order": 1}', t.endpoints,
       now() - interval '20 minutes' - make_interval(secs => 3600.0 * ($1 - n) / $1)
FROM (SELECT tenant, count(*) AS endpoints FROM endpoints GROUP BY tenant) t,
     generate_series(0, $1 - 1) AS n
"""
# By the endpoint's number k (ep-k): the newest $2 of a fifth of the
# endpoints pending (k % 5 = 1: ep-1, of t1, is the one listed), the last
# one of one in fifty in flight, the first three of a tenth dead, the rest
# delivered.
DELIVERIES = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, attempted_by,
                        created_at, next_attempt_at, delivered_at, last_status, last_error)
SELECT ep.id, ep.tenant, 'ev-' || n, s.state,
       CASE WHEN s.state = 'dead' THEN 5 ELSE 1 END, 'worker-' || (ep.id % 3),
       now() - interval '20 minutes' - make_interval(secs => 3600.0 * ($1 - n) / $1 + ep.id % 600),
       now() + make_interval(secs => ep.id % 60),
       CASE WHEN s.state = 'delivered'
            THEN now() - interval '20 minutes' - make_interval(secs => 3600.0 * ($1 - n) / $1) END,
       CASE s.state WHEN 'delivered' THEN 200 WHEN 'dead' THEN 503 END,
       CASE WHEN s.state = 'dead' THEN 'HTTP 503' END
FROM endpoints ep, generate_series(0, $1 - 1) AS n,
     LATERAL (SELECT substr(ep.name, 4)::int AS k) e,
     LATERAL (SELECT CASE WHEN e.k % 5 = 1 AND n >= $1 - $2 THEN 'pending'
                          WHEN e.k % 50 = 2 AND n = $1 - 1 THEN 'sending'
                          WHEN e.k % 10 = 3 AND n < 3 THEN 'dead'
                          ELSE 'delivered' END AS state) s
"""
# An attempt for each delivery tried and finished, as its worker recorded it.
DELIVERY_ATTEMPTS = """
INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id, attempted_by,
                               started_at, duration_seconds, outcome, status, error, recorded_at)
SELECT d.id, d.attempts, d.endpoint_id, d.event_tenant, d.event_id, d.attempted_by,
       d.created_at, 0.04, d.state, d.last_status, d.last_error, d.created_at + interval '50 milliseconds'
FROM deliveries d WHERE d.state IN ('delivered', 'dead')
"""
# $1 attempts over the $2 days before 20 minutes ago, newest first, spread
# over every endpoint; one in a hundred dead, one in ten a retry.
HISTORY = """
INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id, attempted_by,
                               started_at, duration_seconds, outcome, status, error, recorded_at)
SELECT 100000000 + g, 1 + g % 3, ep0 + g % $3, 'history', 'hist-' || g, 'worker-' || (g % 3),
       at - interval '40 milliseconds', 0.04, o.outcome,
       CASE o.outcome WHEN 'delivered' THEN 200 ELSE 503 END,
       CASE WHEN o.outcome <> 'delivered' THEN 'HTTP 503' END, at
FROM (SELECT min(id) AS ep0 FROM endpoints) e0, generate_series(0, $1 - 1) AS g,
     LATERAL (SELECT now() - interval '20 minutes' - make_interval(secs => 86400.0 * $2 * g / $1) AS at,
                     CASE WHEN g % 100 = 7 THEN 'dead' WHEN g % 10 = 3 THEN 'retry'
                          ELSE 'delivered' END AS outcome) o
"""


def _midnight(days_ago: int) -> datetime:
    day = (datetime.now(UTC) - timedelta(days=days_ago)).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


async def attempt_partitions(conn: asyncpg.Connection, days: int) -> None:
    """The daily partitions of the ``days`` before today, as maintenance
    made them on their days (the migration made today's and three ahead)."""
    for back in range(1, days + 1):
        day = _midnight(back)
        name = f"delivery_attempts_{day:%Y%m%d}"
        if await conn.fetchval("SELECT to_regclass($1) IS NULL", name):
            await conn.execute(
                f"CREATE TABLE {name} PARTITION OF delivery_attempts"
                f" FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
            )


async def seed(dsn: str, endpoints: int, cfg: Config, history: int) -> dict:
    conn = await asyncpg.connect(dsn)
    try:
        started = time.perf_counter()
        await attempt_partitions(conn, max(1, cfg.history_days if history else 1))
        await conn.execute(ENDPOINTS, endpoints, endpoints // PER_TENANT, SECRET)
        await conn.execute(EVENTS, cfg.deliveries)
        await conn.execute(DELIVERIES, cfg.deliveries, max(1, cfg.deliveries // 6))
        await conn.execute(DELIVERY_ATTEMPTS)
        if history:
            await conn.execute(HISTORY, history, cfg.history_days, endpoints)
        # The notifications tenant's inbox, which every notice goes to.
        await store.upsert_endpoint(
            conn,
            EndpointSpec(
                namespace="ops",
                name="inbox",
                url="https://ops.example/inbox",
                tenant=OPS,
                event_types=("hooklane.endpoint.*",),
            ),
            SECRET,
        )
        await conn.execute("VACUUM ANALYZE")
        counts = await conn.fetchrow(
            """SELECT (SELECT count(*) FROM endpoints) AS endpoints,
                      (SELECT count(*) FROM deliveries) AS deliveries,
                      (SELECT count(*) FROM delivery_attempts) AS attempts,
                      (SELECT count(*) FROM delivery_attempts WHERE outcome = 'dead') AS dead_attempts,
                      pg_size_pretty(pg_database_size(current_database())) AS database_size"""
        )
        return {**dict(counts), "seconds": time.perf_counter() - started}
    finally:
        await conn.close()


@dataclass
class Database:
    label: str
    endpoints: int
    dsn: str
    seeded: dict
    api: bool  # measured through the API too
    tenant_token: str = ""
    big_token: str = ""
    listed: tuple[str, str] = ("", "")  # the endpoint whose deliveries are listed
    port: int = 0
    process: subprocess.Popen | None = None


async def tokens(db: Database) -> None:
    conn = await asyncpg.connect(db.dsn)
    try:
        db.tenant_token = (await grants.issue(conn, TENANT, grants.Access.READ, 7200, link=False)).token
        db.big_token = (await grants.issue(conn, BIG, grants.Access.READ, 7200, link=False)).token
        row = await conn.fetchrow("SELECT namespace, name, tenant FROM endpoints WHERE name = 'ep-1'")
        assert row["tenant"] == TENANT, row
        db.listed = (row["namespace"], row["name"])
    finally:
        await conn.close()


# --------------------------------------------------------------------------
# The API


def start_api(db: Database, port: int) -> subprocess.Popen:
    env = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": db.dsn,
        "HOOKLANE_ADMIN_TOKENS": ADMIN_TOKEN,
        "HOOKLANE_API_TOKENS": ADMIN_TOKEN + "-ingest",
        "HOOKLANE_METRICS_PORT": "0",
        "HOOKLANE_API_PORT": str(port),
    }
    return subprocess.Popen(python_module("hooklane.cli", "--log-level", "WARNING", "api"), env=env, cwd=REPO)


async def wait_up(session: aiohttp.ClientSession, port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            async with session.get(f"http://127.0.0.1:{port}/healthz") as answer:
                if answer.status == 200:
                    return
        except aiohttp.ClientError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError(f"the API on port {port} did not come up")
        await asyncio.sleep(0.2)


@contextlib.asynccontextmanager
async def apis(dbs: list[Database]) -> AsyncIterator[aiohttp.ClientSession]:
    ports = free_ports(len(dbs))
    try:
        for db, port in zip(dbs, ports, strict=True):
            db.port, db.process = port, start_api(db, port)
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            for db in dbs:
                await wait_up(session, db.port)
            yield session
    finally:
        for db in dbs:
            if db.process is not None:
                stop_process(db.process)


def requests_of(db: Database) -> dict[tuple[str, str], tuple[str, dict[str, str]]]:
    """(listing, way) to the path and headers of its request."""
    ns, name = db.listed
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    tenant = {"Authorization": f"Bearer {db.tenant_token}"}
    return {
        ("deliveries", "admin"): (f"/v1/admin/endpoints/{ns}/{name}/deliveries", admin),
        ("deliveries", "tenant"): (f"/v1/tenant/endpoints/{ns}/{name}/deliveries", tenant),
        ("endpoints", "admin"): (f"/v1/admin/endpoints?tenant={TENANT}", admin),
        ("endpoints", "tenant"): ("/v1/tenant/endpoints", tenant),
    }


async def window(
    session: aiohttp.ClientSession,
    url: str,
    headers: dict[str, str],
    cfg: Config,
    server: Server,
    api: psutil.Process,
) -> dict:
    """``clients`` loops request ``url`` until the window ends; the requests
    completed in it, their times and what they cost."""
    times: list[float] = []
    sizes: set[int] = set()
    measuring = False
    stop = asyncio.Event()

    async def client() -> None:
        while not stop.is_set():
            started = time.perf_counter()
            async with session.get(url, headers=headers) as answer:
                body = await answer.read()
                if answer.status != 200:
                    raise RuntimeError(f"{url}: {answer.status} {body[:300]!r}")
            if measuring:
                times.append(time.perf_counter() - started)
                sizes.add(len(body))

    tasks = [asyncio.create_task(client()) for _ in range(cfg.clients)]
    try:
        await asyncio.sleep(cfg.warmup)
        measuring = True
        before = (time.monotonic(), server.cpu(), cpu_seconds(api), own_cpu())
        await asyncio.sleep(cfg.seconds)
        after = (time.monotonic(), server.cpu(), cpu_seconds(api), own_cpu())
        measuring = False
        done = len(times)
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    wall, pg, api_cpu, client_cpu = (a - b for a, b in zip(after, before, strict=True))
    return {
        "requests": done,
        "requests_per_s": done / wall,
        "p50_ms": 1000 * percentile(times[:done], 50),
        "p99_ms": 1000 * percentile(times[:done], 99),
        "postgres_ms_per_request": 1000 * pg / done,
        "api_ms_per_request": 1000 * api_cpu / done,
        "client_ms_per_request": 1000 * client_cpu / done,
        "bytes": max(sizes),
        "load_average": os.getloadavg()[0],
    }


async def measure_api(
    session: aiohttp.ClientSession, dbs: list[Database], cfg: Config, server: Server
) -> dict:
    runs = []
    for round_ in range(cfg.rounds):
        for db in dbs if round_ % 2 == 0 else dbs[::-1]:
            requests = requests_of(db)
            for listing in ("deliveries", "endpoints"):
                ways = ("admin", "tenant") if round_ % 2 == 0 else ("tenant", "admin")
                for way in ways:
                    path, headers = requests[(listing, way)]
                    url = f"http://127.0.0.1:{db.port}{path}"
                    got = await window(session, url, headers, cfg, server, psutil.Process(db.process.pid))
                    runs.append({"size": db.label, "listing": listing, "way": way, "round": round_, **got})
    return {"runs": runs, "summary": api_summary(runs)}


FIGURES = ("requests_per_s", "p50_ms", "p99_ms", "postgres_ms_per_request", "api_ms_per_request")


def api_summary(runs: list[dict]) -> list[dict]:
    """Medians over the rounds of each variant, and tenant over admin."""
    out = []
    keys = dict.fromkeys((r["size"], r["listing"]) for r in runs)
    for size, listing in keys:
        medians = {}
        for way in ("admin", "tenant"):
            mine = [r for r in runs if (r["size"], r["listing"], r["way"]) == (size, listing, way)]
            medians[way] = {f: statistics.median(r[f] for r in mine) for f in FIGURES}
            medians[way]["bytes"] = max(r["bytes"] for r in mine)
        ratio = {f: medians["tenant"][f] / medians["admin"][f] for f in FIGURES}
        out.append({"size": size, "listing": listing, **medians, "tenant_over_admin": ratio})
    return out


async def measure_portal(
    session: aiohttp.ClientSession, dbs: list[Database], cfg: Config, server: Server
) -> dict:
    """``GET /portal`` one at a time, every size and tenant in turn."""
    seen: dict[tuple[str, str], list[tuple[float, float, int]]] = {}
    for run in range(cfg.page_runs):
        for db in dbs if run % 2 == 0 else dbs[::-1]:
            for tenant, token in ((TENANT, db.tenant_token), (BIG, db.big_token)):
                pg = server.cpu()
                started = time.perf_counter()
                async with session.get(
                    f"http://127.0.0.1:{db.port}/portal", headers={"Cookie": f"hooklane_portal={token}"}
                ) as answer:
                    body = await answer.read()
                    if answer.status != 200:
                        raise RuntimeError(f"/portal: {answer.status} {body[:300]!r}")
                took = time.perf_counter() - started
                seen.setdefault((db.label, tenant), []).append((took, server.cpu() - pg, len(body)))
    pages = []
    for (size, tenant), got in seen.items():
        times = [t for t, _, _ in got]
        pages.append(
            {
                "size": size,
                "tenant": tenant,
                "n": len(got),
                "p50_ms": 1000 * statistics.median(times),
                "max_ms": 1000 * max(times),
                # The server's CPU is counted in clock ticks (10 ms): a mean.
                "postgres_ms": 1000 * statistics.mean(pg for _, pg, _ in got),
                "bytes": max(b for _, _, b in got),
            }
        )
    plans = {}
    for db in dbs:
        conn = await asyncpg.connect(db.dsn)
        try:
            chosen = store.EndpointFilter(tenant=TENANT).parameters()
            page = {**chosen, "cursor_oldest_pending_at": None, "cursor_namespace": None, "cursor_name": None}
            plans[db.label] = {
                "endpoint_page": await explain(conn, "endpoint_page", **page, limit=51),
                "endpoint_totals": await explain(conn, "endpoint_totals", **chosen),
            }
        finally:
            await conn.close()
    return {"pages": pages, "plans": plans}


# --------------------------------------------------------------------------
# Plans


def _scans(node: dict, out: list[dict]) -> list[dict]:
    if "Relation Name" in node or "Index Name" in node:
        out.append(
            {
                "node": node["Node Type"],
                "on": node.get("Index Name") or node.get("Relation Name"),
                "rows": node.get("Actual Rows", 0) * node.get("Actual Loops", 1),
                "loops": node.get("Actual Loops", 1),
            }
        )
    for child in node.get("Plans", []):
        _scans(child, out)
    return out


async def explain(conn: asyncpg.Connection, name: str, **params: object) -> dict:
    """EXPLAIN ANALYZE of a statement of queries.sql: the server's time,
    the buffers it touched, and the five scans that returned the most rows."""
    query = QUERIES[name]
    text = await conn.fetchval("EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) " + query.sql, *query.args(**params))
    [found] = json.loads(text)
    plan = found["Plan"]
    scans = sorted(_scans(plan, []), key=lambda s: -s["rows"])
    return {
        "ms": found["Execution Time"],
        "shared_hit": plan.get("Shared Hit Blocks", 0),
        "shared_read": plan.get("Shared Read Blocks", 0),
        "top_scans": scans[:5],
    }


# --------------------------------------------------------------------------
# Notifications


@dataclass
class State:
    """One state the pass is measured in: ``reset`` (before the untimed
    pass), ``make`` (after it, given its cut), and what the timed pass
    must have noted and published."""

    name: str
    reset: Callable[[asyncpg.Connection, Database], Awaitable[None]]
    make: Callable[[asyncpg.Connection, Database, datetime], Awaitable[None]]
    expect: Callable[[Database], tuple[dict[str, int], int]]


def spread(endpoints: int, count: int) -> str:
    """SQL choosing ``count`` endpoints spread over the ids (not the inbox)."""
    step = max(1, endpoints // count)
    return (
        f"SELECT id FROM endpoints WHERE tenant <> '{OPS}'"
        f" AND (id - (SELECT min(id) FROM endpoints)) % {step} = 0 ORDER BY id LIMIT {count}"
    )


async def _nothing(conn: asyncpg.Connection, db: Database, *_: object) -> None:
    return None


def states(cfg: Config) -> list[State]:
    async def close_opened(conn: asyncpg.Connection, db: Database) -> None:
        ids = spread(db.endpoints, cfg.openings)
        await conn.execute(
            f"UPDATE endpoints SET failing_since = NULL, paused_until = NULL, consecutive_failures = 0,"
            f" last_error = NULL WHERE id IN ({ids}) AND failing_since IS NOT NULL"
        )
        await conn.execute(f"DELETE FROM endpoint_notices WHERE endpoint_id IN ({ids}) AND kind = 'paused'")

    async def open_some(conn: asyncpg.Connection, db: Database, _cut: datetime) -> None:
        await conn.execute(
            "UPDATE endpoints SET failing_since = now() - interval '5 seconds',"
            " paused_until = now() + interval '10 minutes', consecutive_failures = 5,"
            f" last_error = 'HTTP 503' WHERE id IN ({spread(db.endpoints, cfg.openings)})"
        )

    async def forget_dead(conn: asyncpg.Connection, db: Database) -> None:
        await conn.execute(
            f"DELETE FROM endpoint_notices WHERE endpoint_id IN ({spread(db.endpoints, cfg.dead_endpoints)})"
            " AND kind = 'deliveries_dead'"
        )

    async def record_dead(conn: asyncpg.Connection, db: Database, cut: datetime) -> None:
        # Recorded within a millisecond after the untimed pass's cut: in the
        # timed pass's window, whose cut is later.
        await conn.execute(
            f"""
            WITH chosen AS (SELECT array_agg(id) AS ids FROM ({spread(db.endpoints, cfg.dead_endpoints)}) c)
            INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                           attempted_by, started_at, duration_seconds, outcome, status,
                                           error, recorded_at)
            SELECT 900000000 + g, 5, ids[1 + g % cardinality(ids)], 'dead', 'dead-' || g, 'worker-0',
                   $1::timestamptz - interval '1 second', 0.04, 'dead', 503, 'HTTP 503 Service Unavailable',
                   $1::timestamptz + make_interval(secs => 0.0001 * (1 + g % 9))
            FROM chosen, generate_series(0, $2 - 1) AS g
            """,
            cut,
            cfg.dead_endpoints * cfg.dead_per_endpoint,
        )

    return [
        State("steady", _nothing, _nothing, lambda db: ({}, 0)),
        State(
            "openings",
            close_opened,
            open_some,
            lambda db: ({"paused": cfg.openings}, min(BATCH, cfg.openings)),
        ),
        State(
            "dead",
            forget_dead,
            record_dead,
            lambda db: ({"deliveries_dead": cfg.dead_endpoints}, min(BATCH, cfg.dead_endpoints)),
        ),
        # Set up once, before its passes (all_open_setup).
        State("all_open", _nothing, _nothing, lambda db: ({}, 0)),
    ]


async def all_open_setup(conn: asyncpg.Connection) -> int:
    """Every circuit open, each opening noticed and told already: what a
    worker leaves after an outage of every receiver."""
    await conn.execute(
        "UPDATE endpoints SET failing_since = now() - interval '1 hour',"
        " paused_until = now() + interval '1 hour', consecutive_failures = 10, last_error = 'HTTP 503'"
        f" WHERE tenant <> '{OPS}'"
    )
    await conn.execute(
        f"""
        INSERT INTO endpoint_notices (endpoint_id, kind, seen, transitions, notified_at, due_at)
        SELECT id, 'paused', failing_since, 0, now(), NULL FROM endpoints WHERE tenant <> '{OPS}'
        ON CONFLICT (endpoint_id, kind) DO UPDATE
        SET seen = EXCLUDED.seen, transitions = 0, notified_at = EXCLUDED.notified_at, due_at = NULL
        """
    )
    await conn.execute("VACUUM ANALYZE endpoints")
    await conn.execute("VACUUM ANALYZE endpoint_notices")
    return await conn.fetchval("SELECT count(*) FROM endpoints WHERE paused_until > now()")


def _noted(notified: Notified) -> dict[str, int]:
    noted = notified.noted
    return {
        k: v
        for k, v in (
            ("paused", noted.paused),
            ("deactivated", noted.deactivated),
            ("deliveries_dead", noted.deliveries_dead),
        )
        if v
    }


async def one_pass(
    conn: asyncpg.Connection, db: Database, notifier: Notifications, state: State, server: Server
) -> dict:
    await state.reset(conn, db)
    primed = await notifier.run_once(conn)
    assert primed is not None
    await state.make(conn, db, primed.noted.cut)
    await asyncio.sleep(0.01)  # the timed pass's cut after what was made
    pg = server.cpu()
    started = time.perf_counter()
    notified = await notifier.run_once(conn)
    took = time.perf_counter() - started
    pg = server.cpu() - pg
    assert notified is not None
    noted, published = state.expect(db)
    if _noted(notified) != noted or len(notified.published) != published:
        raise RuntimeError(
            f"{state.name} at {db.label}: noted {_noted(notified)}, published {len(notified.published)};"
            f" expected {noted} and {published}"
        )
    return {"ms": 1000 * took, "postgres_ms": 1000 * pg, "noted": noted, "published": published}


async def pass_plans(conn: asyncpg.Connection, db: Database, notifier: Notifications, state: State) -> dict:
    """The plans of the pass's two statements in ``state``, and the time of
    each step of the pass (note, take, publish), each rolled back."""
    await state.reset(conn, db)
    primed = await notifier.run_once(conn)
    assert primed is not None
    await state.make(conn, db, primed.noted.cut)
    await asyncio.sleep(0.01)
    note_args = {
        "tenant": OPS,
        "since": primed.noted.cut,
        "lookback_seconds": LOOKBACK_SECONDS,
        "settle_seconds": SETTLE_SECONDS,
        "interval_seconds": Settings().notification_interval_seconds,
    }
    out: dict = {}
    async with rolled_back(conn):
        out["note_notices"] = await explain(conn, "note_notices", **note_args)
        out["take_notices"] = await explain(
            conn, "take_notices", tenant=OPS, settle_seconds=SETTLE_SECONDS, limit=BATCH
        )
    steps: dict[str, float] = {}
    async with rolled_back(conn):
        started = time.perf_counter()
        await store.note_notices(conn, **note_args)  # type: ignore[arg-type]
        steps["note_ms"] = 1000 * (time.perf_counter() - started)
        started = time.perf_counter()
        async with store.take_notices(
            conn, tenant=OPS, settle_seconds=SETTLE_SECONDS, limit=BATCH
        ) as notices:
            steps["take_ms"] = 1000 * (time.perf_counter() - started)
            started = time.perf_counter()
            await store.insert_events(conn, [notice_event(OPS, n) for n in notices])
            steps["publish_ms"] = 1000 * (time.perf_counter() - started)
        steps["notices"] = len(notices)
    out["steps"] = steps
    return out


@contextlib.asynccontextmanager
async def rolled_back(conn: asyncpg.Connection) -> AsyncIterator[None]:
    tx = conn.transaction()
    await tx.start()
    try:
        yield
    finally:
        await tx.rollback()


async def measure_notifications(dbs: list[Database], cfg: Config, server: Server) -> dict:
    conns = {db.label: await asyncpg.connect(db.dsn) for db in dbs}
    notifiers = {db.label: Notifications(Settings(notifications_tenant=OPS)) for db in dbs}
    runs: list[dict] = []
    plans: dict[str, dict] = {}
    open_circuits: dict[str, int] = {}
    try:
        for state in states(cfg):
            if state.name == "all_open":
                for db in dbs:
                    open_circuits[db.label] = await all_open_setup(conns[db.label])
            for n in range(cfg.passes):
                for db in dbs if n % 2 == 0 else dbs[::-1]:
                    got = await one_pass(conns[db.label], db, notifiers[db.label], state, server)
                    runs.append({"state": state.name, "size": db.label, "pass": n, **got})
            for db in dbs:
                plans.setdefault(state.name, {})[db.label] = await pass_plans(
                    conns[db.label], db, notifiers[db.label], state
                )
                # What it left (open circuits, notices) is not the next state's.
                await state.reset(conns[db.label], db)
    finally:
        for conn in conns.values():
            await conn.close()
    summary = []
    for state in states(cfg):
        for db in dbs:
            mine = [r for r in runs if (r["state"], r["size"]) == (state.name, db.label)]
            summary.append(
                {
                    "state": state.name,
                    "size": db.label,
                    "ms": statistics.median(r["ms"] for r in mine),
                    "ms_range": [min(r["ms"] for r in mine), max(r["ms"] for r in mine)],
                    # The server's CPU is counted in clock ticks (10 ms): a mean.
                    "postgres_ms": statistics.mean(r["postgres_ms"] for r in mine),
                    "noted": mine[0]["noted"],
                    "published": mine[0]["published"],
                }
            )
    return {"runs": runs, "summary": summary, "plans": plans, "all_open_circuits": open_circuits}


# --------------------------------------------------------------------------


def growth(summary: list[dict], key: str, value: str, dbs: list[Database]) -> dict[str, float]:
    """Each ``key``'s ``value`` at the largest size over the smallest."""
    first, last = dbs[0].label, dbs[-1].label
    out = {}
    for k in dict.fromkeys(s[key] for s in summary):
        at = {s["size"]: s[value] for s in summary if s[key] == k}
        if first in at and last in at:
            out[k] = at[last] / at[first]
    return out


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(cfg, **{k: v for k in ("rounds", "passes") if (v := getattr(args, k)) is not None})
    if args.no_history:
        cfg = replace(cfg, history=0)
    result: dict = {"config": asdict(cfg), "machine": machine(), "started": datetime.now(UTC).isoformat()}
    with postgres_server(args.dsn) as server_dsn:
        async with contextlib.AsyncExitStack() as stack:
            dbs: list[Database] = []
            wanted = [(f"{n:,}", n, 0, True) for n in cfg.sizes]
            if cfg.history:
                last = cfg.sizes[-1]
                wanted.append((f"{last:,} + {cfg.history:,} attempts", last, cfg.history, False))
            for label, endpoints, history, api in wanted:
                dsn = await stack.enter_async_context(fresh_database(server_dsn, "tenants"))
                seeded = await seed(dsn, endpoints, cfg, history)
                dbs.append(Database(label, endpoints, dsn, seeded, api))
            result["databases"] = {db.label: db.seeded for db in dbs}
            conn = await asyncpg.connect(dbs[0].dsn)
            try:
                server = Server(await conn.fetchval("SELECT pg_backend_pid()"))
            finally:
                await conn.close()
            served = [db for db in dbs if db.api]
            for db in served:
                await tokens(db)
            started = time.perf_counter()
            async with apis(served) as session:
                result["api"] = await measure_api(session, served, cfg, server)
                result["portal"] = await measure_portal(session, served, cfg, server)
            result["api_seconds"] = time.perf_counter() - started
            started = time.perf_counter()
            result["notifications"] = await measure_notifications(dbs, cfg, server)
            result["notifications_seconds"] = time.perf_counter() - started
            result["growth"] = {
                "api_postgres_ms_per_request": growth(
                    [
                        {"what": f"{s['listing']} {way}", "size": s["size"], **s[way]}
                        for s in result["api"]["summary"]
                        for way in ("admin", "tenant")
                    ],
                    "what",
                    "postgres_ms_per_request",
                    served,
                ),
                "portal_p50": growth(result["portal"]["pages"], "tenant", "p50_ms", served),
                "pass_ms": growth(result["notifications"]["summary"], "state", "ms", served),
            }
    return result


def brief(result: dict) -> dict:
    return {
        "databases": result["databases"],
        "api": [
            {
                "size": s["size"],
                "listing": s["listing"],
                **{
                    f"{way} {f}": round(s[way][f], 3)
                    for way in ("admin", "tenant")
                    for f in ("requests_per_s", "p50_ms", "p99_ms", "postgres_ms_per_request")
                },
                "ratio": {f: round(v, 2) for f, v in s["tenant_over_admin"].items()},
            }
            for s in result["api"]["summary"]
        ],
        "portal": result["portal"]["pages"],
        "notifications": result["notifications"]["summary"],
        "growth": result["growth"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="smoke")
    parser.add_argument("--dsn", help="a server to create the databases on (default: a throwaway one)")
    parser.add_argument("--rounds", type=int)
    parser.add_argument("--passes", type=int)
    parser.add_argument("--no-history", action="store_true", help="leave out the database with the history")
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(main_async, args, brief)


if __name__ == "__main__":
    main()

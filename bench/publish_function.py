"""Publishing through the function (issue 24): today's statements beside
``hooklane_try_publish_v1``, side by side in one run.

Today's path is the previous release's (``--before``, 39e890d): its
``publish`` statement (one CTE statement, no input checks in SQL; then
``event_conflict`` only when it could not tell) for one event, and for a
batch ``executemany`` of ``publish``, pipelined, then one
``events_conflicting``, as its ``store.insert_events`` did. The function's
path is this tree's ``publish`` and ``publish_many`` (migration 0012: the
input checks, the write, the refusals in the result). Both run on one
database migrated by this tree: 0012 only adds functions.

1. **Direct** (``direct``): ``connections`` sessions publish as fast as
   they can, each transaction BEGIN, one event (``single``) or a batch of
   ``batch`` events, COMMIT, with ``synchronous_commit`` as the database
   has it (a LocalPostgres: off). The events are of one tenant with
   ``endpoints`` matching endpoints (each event fans out to that many
   deliveries; the tenant has one more endpoint for other types, and 20
   other tenants three each), with ids as the function makes them (``msg_``
   and 32 hex digits) and as data an order of nested JSON with integers and
   decimals, of each size of ``sizes`` (about 1 KiB, and 64 KiB to show how
   the checks' cost grows). For each workload the two paths take turns,
   ``rounds`` windows each, alternating which goes first; every window
   starts on empty tables (TRUNCATE, CHECKPOINT) and warms up before it is
   measured. Per window: events/s committed, PostgreSQL CPU per event
   (utime + stime of every process of the server, exited ones included,
   from /proc: bench/steady.py's sampler) and this driver's CPU per event;
   then the tables are counted: every event and delivery must be there.
   Medians over the rounds, their range, and the function's over today's.
2. **Checks alone** (``checks``): what each check of
   ``hooklane_publish_refusal_v1`` costs per event at each size of
   ``check_sizes`` (the id's pattern, and beside it the same rule written
   without a bounded repetition; the depth walk, the 64-bit integer walk,
   ``octet_length(data::text)``; the whole refusal function), timed by the
   server (EXPLAIN ANALYZE) over stored events: where the ratios of 1. come
   from.
3. **Ingest API** (``ingest``): ``hooklane api`` of the previous tree
   (``--before-tree``, or ``hooklane/`` of ``--before`` exported with ``git
   archive``) and of this one, both on one database (three matching
   endpoints), loaded in turns by bench/ingest_load.py (its ~250-byte
   events): single events from ``ingest_clients`` clients, then batches
   from ``ingest_batch_clients``; events/s in the window, and CPU per event
   accepted of the API process and of PostgreSQL over the whole load run.

``--variant FILE`` runs SQL on each database once migrated: a scratch
run of a variant of the functions (``CREATE OR REPLACE``), to time a
change before it becomes a migration.

Run: ``python -m bench.publish_function --preset full`` (~6.5 min;
``smoke`` is what the tests run; ``--dsn`` a server of this machine to
create the databases on, default a throwaway LocalPostgres.)
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import json
import os
import resource
import secrets
import shutil
import statistics
import subprocess
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import asyncpg
import psutil

from bench import ingest
from bench.common import (
    REPO,
    SECRET,
    free_ports,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
    worker_env,
)
from bench.steady import cpu_seconds
from hooklane import store
from hooklane.spec import EndpointSpec
from hooklane.store.queries import QUERIES, Query, load

BEFORE = "39e890d"
TENANT = "acme"
TYPE = "order.updated"
TARGET_RATIO = 1.10  # the issue's: the function no worse than today by more than 10%


@dataclass(frozen=True)
class Config:
    rounds: int  # windows per workload and path, alternating which path goes first
    warmup: float  # seconds published before each window
    seconds: float  # measured, per window
    connections: int  # sessions publishing at once
    batch: int  # events per transaction of a batch (and per ingest batch request)
    endpoints: int  # matching endpoints of the tenant: the fan-out
    sizes: tuple[int, ...]  # bytes of JSON of each event's data
    check_sizes: tuple[int, ...]  # sizes the checks alone are timed at
    check_bytes: int  # of stored events per size the checks are timed over
    ingest_rounds: int
    ingest_warmup: float
    ingest_seconds: float
    ingest_clients: int  # single-event requests in flight
    ingest_batch_clients: int  # batch requests in flight


PRESETS = {
    "full": Config(
        rounds=4,
        warmup=1.5,
        seconds=6,
        connections=4,
        batch=100,
        endpoints=3,
        sizes=(1024, 65536),
        check_sizes=(256, 1024, 4096, 16384, 65536, 262000),
        check_bytes=8 * 2**20,
        ingest_rounds=3,
        ingest_warmup=2,
        ingest_seconds=8,
        ingest_clients=64,
        ingest_batch_clients=8,
    ),
    "smoke": Config(
        rounds=1,
        warmup=0.2,
        seconds=0.5,
        connections=2,
        batch=10,
        endpoints=3,
        sizes=(1024, 8192),
        check_sizes=(1024, 8192),
        check_bytes=2**16,
        ingest_rounds=1,
        ingest_warmup=0.3,
        ingest_seconds=1,
        ingest_clients=4,
        ingest_batch_clients=1,
    ),
}

PATHS = ("today", "function")


# --------------------------------------------------------------------------
# The events


def order(n: int, size: int) -> str:
    """About ``size`` bytes of JSON: an order with a customer, an address, a
    list of items (each with integers, decimals and an object of
    attributes) and totals, five levels deep at most."""

    def item(i: int) -> dict:
        return {
            "sku": f"SKU-{(n * 7 + i) % 100000:05d}",
            "name": f"Item {i} of order {n}",
            "quantity": 1 + i % 3,
            "unit_price": round(4.99 + (n + i) % 200 * 0.5, 2),
            "tax_rate": 0.2,
            "weight_grams": 150 + (i * 37) % 900,
            "attributes": {"size": "ML"[i % 2], "color": ("blue", "red", "black")[i % 3]},
        }

    items: list[dict] = []
    data = {
        "order": {
            "id": 9_000_000_000 + n,
            "number": f"SO-{n:08d}",
            "status": "paid",
            "currency": "EUR",
            "created_at": "2026-12-05T10:15:30.123Z",
            "customer": {
                "id": 40_000 + n,
                "email": f"buyer{n}@example.com",
                "name": "Ada Lovelace",
                "address": {
                    "line1": "12 Analytical Way",
                    "city": "London",
                    "postcode": "N1 9GU",
                    "country": "GB",
                },
            },
            "items": items,
            "totals": {"net": 100.5 + n % 1000, "tax": 20.1, "gross": 120.6 + n % 1000, "count": 0},
        },
        "metadata": {"source": "web", "attempt": 1, "tags": ["priority", "gift"]},
    }
    base = len(json.dumps(data, separators=(",", ":")))
    each = len(json.dumps(item(0), separators=(",", ":"))) + 1
    items.extend(item(i) for i in range(max(1, round((size - base) / each))))
    data["order"]["totals"]["count"] = len(items)
    return json.dumps(data, separators=(",", ":"))


class Events:
    """Events of one workload: new ids, data cycling through a few orders of
    the size, made before the run so that making them costs nothing in it."""

    def __init__(self, size: int) -> None:
        self.payloads = [order(n, size) for n in range(16)]
        self.prefix = secrets.token_hex(4)
        self.n = 0

    def next(self) -> dict[str, str | None]:
        self.n += 1
        return {
            # As the function makes them: msg_ and 32 hex digits.
            "id": f"msg_{self.prefix}{self.n:024x}",
            "tenant": TENANT,
            "type": TYPE,
            "data": self.payloads[self.n % len(self.payloads)],
            "coalesce_key": None,
            "traceparent": None,
        }


# --------------------------------------------------------------------------
# The two paths


class Today:
    """The previous release's statements, used as its store.insert_event and
    insert_events used them."""

    def __init__(self, queries: dict[str, Query], fanout: int) -> None:
        self.publish = queries["publish"]
        self.conflict = queries["event_conflict"]
        self.conflicting = queries["events_conflicting"]
        self.fanout = fanout

    async def one(self, conn: asyncpg.Connection, event: dict) -> None:
        row = await conn.fetchrow(*self.publish(**event))
        assert row is not None, "publish returns one row, always"
        if row["fanout"] is None and row["conflict"] is None:
            await conn.fetchval(*self.conflict(**{k: v for k, v in event.items() if k != "traceparent"}))
        if row["fanout"] != self.fanout:
            raise RuntimeError(f"today's publish stored {row['fanout']} deliveries, not {self.fanout}")

    async def many(self, conn: asyncpg.Connection, events: list[dict]) -> None:
        await conn.executemany(self.publish.sql, [self.publish.args(**event) for event in events])
        rows = await conn.fetch(
            *self.conflicting(
                ids=[e["id"] for e in events],
                tenants=[e["tenant"] for e in events],
                types=[e["type"] for e in events],
                data=[e["data"] for e in events],
                coalesce_keys=[e["coalesce_key"] for e in events],
            )
        )
        if rows:
            raise RuntimeError(f"today's events_conflicting found {len(rows)} conflicts among new ids")


class Function:
    """This tree's statements: hooklane_try_publish_v1, once or per element."""

    def __init__(self, queries: dict[str, Query], fanout: int) -> None:
        self.publish = queries["publish"]
        self.many_ = queries["publish_many"]
        self.fanout = fanout

    async def one(self, conn: asyncpg.Connection, event: dict) -> None:
        # Unordered, where the statement knows of ordering keys (0026).
        unordered = {"ordering_key": None} if "ordering_key" in self.publish.params else {}
        row = await conn.fetchrow(*self.publish(**event, **unordered))
        assert row is not None, "publish returns one row, always"
        if row["error_code"] is not None or row["fanout"] != self.fanout:
            raise RuntimeError(f"the function answered {dict(row)}")

    async def many(self, conn: asyncpg.Connection, events: list[dict]) -> None:
        rows = await conn.fetch(
            *self.many_(
                ids=[e["id"] for e in events],
                tenants=[e["tenant"] for e in events],
                types=[e["type"] for e in events],
                data=[e["data"] for e in events],
                coalesce_keys=[e["coalesce_key"] for e in events],
                traceparents=[e["traceparent"] for e in events],
                **({"ordering_keys": [None] * len(events)} if "ordering_keys" in self.many_.params else {}),
            )
        )
        if rows:
            raise RuntimeError(f"publish_many refused {[dict(r) for r in rows]}")


def before_queries(args: argparse.Namespace) -> tuple[dict[str, Query], str]:
    """Today's statements: the queries.sql of ``--before-queries``, or of the
    ``--before`` commit."""
    if args.before_queries:
        return load(Path(args.before_queries).read_text()), str(args.before_queries)
    text = subprocess.run(
        ["git", "-C", str(REPO), "show", f"{args.before}:hooklane/store/queries.sql"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    return load(text), f"{args.before}:hooklane/store/queries.sql"


def tree_state() -> dict:
    """What was measured: HEAD, and a digest of the files of the publish path
    as the work tree has them (uncommitted changes included)."""

    def git(*cmd: str) -> str:
        return subprocess.run(["git", "-C", str(REPO), *cmd], capture_output=True, text=True).stdout.strip()

    files = [
        "hooklane/store/queries.sql",
        "hooklane/store/migrations/0012_publish_function.sql",
        "hooklane/store/events.py",
        "hooklane/api/group_commit.py",
        "hooklane/api/ingest.py",
    ]
    digest = hashlib.sha256()
    for name in files:
        with contextlib.suppress(OSError):
            digest.update((REPO / name).read_bytes())
    return {
        "head": git("rev-parse", "--short", "HEAD"),
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no", "hooklane")),
        "publish_files_sha256": digest.hexdigest()[:12],
    }


# --------------------------------------------------------------------------
# Measuring


class Server:
    """CPU seconds so far of every process of the PostgreSQL server (the
    postmaster, its live children and the ones it reaped)."""

    def __init__(self, backend_pid: int) -> None:
        self.master = psutil.Process(psutil.Process(backend_pid).ppid())

    def cpu(self) -> float:
        return cpu_seconds(self.master)


def own_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


async def connect(dsn: str, count: int) -> list[asyncpg.Connection]:
    return [await asyncpg.connect(dsn) for _ in range(count)]


async def empty_tables(conn: asyncpg.Connection) -> None:
    """Every window starts from the same tables, and from a checkpoint, so
    that neither path inherits the other's dirty pages."""
    await conn.execute("TRUNCATE wakeups, deliveries, events")
    await conn.execute("CHECKPOINT")


async def window(
    conns: list[asyncpg.Connection],
    admin: asyncpg.Connection,
    server: Server,
    publish: Callable[[asyncpg.Connection, Events], Awaitable[int]],
    events: Events,
    cfg: Config,
    endpoints: int,
) -> dict:
    """Each session publishes transaction after transaction until the window
    ends; what was committed in the window, and what it cost."""
    await empty_tables(admin)
    committed = 0
    stop = asyncio.Event()

    async def session(conn: asyncpg.Connection) -> None:
        nonlocal committed
        while not stop.is_set():
            # Not `committed += await ...`: that reads the count before it
            # waits, and the other sessions' commits meanwhile are lost.
            done = await publish(conn, events)
            committed += done

    tasks = [asyncio.create_task(session(conn)) for conn in conns]
    try:
        await asyncio.sleep(cfg.warmup)
        before = (time.monotonic(), committed, server.cpu(), own_cpu())
        await asyncio.sleep(cfg.seconds)
        after = (time.monotonic(), committed, server.cpu(), own_cpu())
    finally:
        stop.set()
        await asyncio.gather(*tasks)
    wall, done, pg, driver = (a - b for a, b in zip(after, before, strict=True))
    stored = await admin.fetchval("SELECT count(*) FROM events")
    deliveries = await admin.fetchval("SELECT count(*) FROM deliveries")
    if stored != committed or deliveries != committed * endpoints:
        raise RuntimeError(f"{committed} events committed, {stored} stored with {deliveries} deliveries")
    return {
        "events_in_window": done,
        "events_per_s": done / wall,
        "postgres_ms_per_event": 1000 * pg / done,
        "driver_ms_per_event": 1000 * driver / done,
        "postgres_cores": pg / wall,
        "load_average": os.getloadavg()[0],
        "stored": stored,
    }


def publisher(path: Today | Function, batch: int) -> Callable[[asyncpg.Connection, Events], Awaitable[int]]:
    """One transaction of one event, or of ``batch``; returns the events."""
    if batch == 1:

        async def single(conn: asyncpg.Connection, events: Events) -> int:
            async with conn.transaction():
                await path.one(conn, events.next())
            return 1

        return single

    async def many(conn: asyncpg.Connection, events: Events) -> int:
        group = [events.next() for _ in range(batch)]
        async with conn.transaction():
            await path.many(conn, group)
        return batch

    return many


def plan(rounds: int, workloads: Sequence[str]) -> list[tuple[int, str, str]]:
    """(round, workload, path) in running order: each workload's two paths
    side by side, the one that goes first alternating from round to round
    (and from workload to workload within a round)."""
    return [
        (r, workload, path)
        for r in range(rounds)
        for k, workload in enumerate(workloads)
        for path in (PATHS if (r + k) % 2 == 0 else PATHS[::-1])
    ]


FIGURES = ("events_per_s", "postgres_ms_per_event", "driver_ms_per_event", "postgres_cores")


def aggregate(runs: list[dict], figures: Sequence[str] = FIGURES) -> list[dict]:
    """Per workload: each path's median of each figure and its range, and
    the function's medians over today's."""
    rows = []
    for workload in dict.fromkeys(r["workload"] for r in runs):
        medians = {}
        for path in PATHS:
            mine = [r for r in runs if r["workload"] == workload and r["path"] == path]
            values = {f: [r[f] for r in mine] for f in figures}
            medians[path] = {f: statistics.median(v) for f, v in values.items()}
            rows.append(
                {
                    "workload": workload,
                    "path": path,
                    "windows": len(mine),
                    "median": medians[path],
                    "range": {f: [min(v), max(v)] for f, v in values.items()},
                }
            )
        rows.append(
            {
                "workload": workload,
                "path": "function / today",
                "ratio": {f: medians["function"][f] / medians["today"][f] for f in medians["today"]},
            }
        )
    return rows


async def create_tenant(conn: asyncpg.Connection, matching: int, tenant: str = TENANT) -> None:
    """The tenant's ``matching`` endpoints of its orders (every other one
    for all its types, the rest for ``order.*``), one for its invoices
    only, and 20 other tenants with three endpoints each."""
    specs = [
        EndpointSpec(
            namespace="bench",
            name=f"{tenant}-{i}",
            url=f"http://127.0.0.1:9/{i}",
            tenant=tenant,
            event_types=("order.*",) if i % 2 else (),
        )
        for i in range(matching)
    ]
    specs.append(
        EndpointSpec(
            namespace="bench",
            name=f"{tenant}-invoices",
            url="http://127.0.0.1:9/inv",
            tenant=tenant,
            event_types=("invoice.*",),
        )
    )
    specs += [
        EndpointSpec(
            namespace="bench", name=f"other-{t}-{i}", url=f"http://127.0.0.1:9/o{t}/{i}", tenant=f"other-{t}"
        )
        for t in range(20)
        for i in range(3)
    ]
    async with conn.transaction():
        for spec in specs:
            await store.upsert_endpoint(conn, spec, SECRET)
    await conn.execute("ANALYZE endpoints")


async def direct(dsn: str, cfg: Config, today: dict[str, Query], variant: str | None) -> dict:
    admin = await asyncpg.connect(dsn)
    if variant:
        await admin.execute(variant)
    sessions = {path: await connect(dsn, cfg.connections) for path in PATHS}
    try:
        await create_tenant(admin, cfg.endpoints)
        server = Server(admin.get_server_pid())
        paths: dict[str, Today | Function] = {
            "today": Today(today, cfg.endpoints),
            "function": Function(QUERIES, cfg.endpoints),
        }
        workloads = {}
        for size in cfg.sizes:
            for batch in (1, cfg.batch):
                name = f"{'single' if batch == 1 else f'batch of {batch}'}, {size // 1024} KiB"
                workloads[name] = (size, batch)
        samples = {size: order(0, size) for size in cfg.sizes}
        data_text = {
            size: await admin.fetchval("SELECT octet_length($1::jsonb::text)", text)
            for size, text in samples.items()
        }
        runs = []
        for r, workload, path in plan(cfg.rounds, list(workloads)):
            size, batch = workloads[workload]
            events = Events(size)
            run = await window(
                sessions[path], admin, server, publisher(paths[path], batch), events, cfg, cfg.endpoints
            )
            runs.append({"round": r, "workload": workload, "path": path, "size": size, "batch": batch, **run})
            print(
                f"{workload:>22} {path:>8}: {run['events_per_s']:8.0f} events/s,"
                f" postgres {run['postgres_ms_per_event']:.3f} ms/event,"
                f" driver {run['driver_ms_per_event']:.3f} ms/event (load {run['load_average']:.1f})",
                flush=True,
            )
        synchronous_commit = await admin.fetchval("SHOW synchronous_commit")
        fsync = await admin.fetchval("SHOW fsync")
    finally:
        for conns in sessions.values():
            for conn in conns:
                await conn.close()
        await admin.close()
    return {
        "postgres_settings": {"synchronous_commit": synchronous_commit, "fsync": fsync},
        "bytes": {size: {"json": len(text), "data_text": data_text[size]} for size, text in samples.items()},
        "runs": runs,
        "summary": aggregate(runs),
    }


# --------------------------------------------------------------------------
# The checks alone

CHECKS = {
    # The id's rule as 0012 was first written, and as it is now.
    "id ~ '^[A-Za-z0-9_.:-]{1,255}$' (36 characters)": "id ~ '^[A-Za-z0-9_.:-]{1,255}$'",
    "the same as length(id) <= 255 AND id ~ '^[A-Za-z0-9_.:-]+$'": (
        "length(id) <= 255 AND id ~ '^[A-Za-z0-9_.:-]+$'"
    ),
    "depth walk ($.**{64 to last})": (
        "NOT jsonb_path_exists(data, 'strict $.**{64 to last} ? "
        '(@.type() == "object" || @.type() == "array")\')'
    ),
    # The integers' rule as first written: a walk of every number.
    "64-bit integer walk ($.** numbers)": (
        'NOT EXISTS (SELECT FROM jsonb_path_query(data, \'strict $.** ? (@.type() == "number" '
        "&& (@ < -9223372036854775808 || @ > 18446744073709551615))') AS n WHERE strpos(n::text, '.') = 0)"
    ),
    "octet_length(data::text)": "octet_length(data::text) <= 262144",
    # Now: 19 digits in a row in the printed text, which the size needs
    # anyway, before any walk (printing included here).
    "data::text ~ '[0-9]{19}'": "data::text !~ '[0-9]{19}'",
    "hooklane_publish_refusal_v1, all": (
        "(hooklane_publish_refusal_v1('acme', 'order.updated', data, id, NULL, NULL)).field IS NULL"
    ),
}


async def checks(dsn: str, cfg: Config, variant: str | None) -> list[dict]:
    """Each check over stored events of each size (``check_bytes`` of them,
    50 to 5,000 rows), timed by the server (EXPLAIN ANALYZE's execution
    time, best of three), per event, less the same scan without the check.
    The scan hands each check a value in memory, as a publish does, not a
    stored one it would read from TOAST again at each use."""
    conn = await asyncpg.connect(dsn)
    if variant:
        await conn.execute(variant)
    results = []
    try:
        await conn.execute("CREATE TEMP TABLE sample (id text, data jsonb)")
        for size in cfg.check_sizes:
            rows = max(50, min(5000, cfg.check_bytes // size))
            payloads = [order(n, size) for n in range(16)]
            await conn.execute("TRUNCATE sample")
            await conn.execute(
                "INSERT INTO sample SELECT 'msg_' || md5(g::text), ($1::text[])[1 + g % 16]::jsonb"
                " FROM generate_series(1, $2) g",
                payloads,
                rows,
            )
            await conn.execute("VACUUM ANALYZE sample")
            text_bytes = await conn.fetchval("SELECT octet_length(data::text) FROM sample LIMIT 1")

            async def timed(predicate: str, rows: int = rows) -> float:
                """Milliseconds of the scan with ``predicate``, best of three."""
                best = float("inf")
                for _ in range(3):
                    plan = await conn.fetchval(
                        "EXPLAIN (ANALYZE, TIMING OFF, FORMAT JSON) "
                        f"SELECT count(*) FILTER (WHERE {predicate}) "
                        "FROM (SELECT id, data || '{}'::jsonb AS data FROM sample OFFSET 0) s"
                    )
                    best = min(best, json.loads(plan)[0]["Execution Time"])
                return best

            scan = await timed("true")
            row = {
                "size": size,
                "rows": rows,
                "json_bytes": len(payloads[0]),
                "data_text_bytes": text_bytes,
                "us_per_event": {
                    name: round(1000 * max(0.0, await timed(predicate) - scan) / rows, 1)
                    for name, predicate in CHECKS.items()
                },
            }
            results.append(row)
            print(f"checks at {size} bytes: {json.dumps(row['us_per_event'])}", flush=True)
    finally:
        await conn.close()
    return results


# --------------------------------------------------------------------------
# The ingest API, before and after


@contextlib.contextmanager
def before_tree(args: argparse.Namespace) -> Iterator[Path]:
    """The previous tree's source: ``--before-tree``, or ``hooklane/`` of the
    ``--before`` commit exported (``git archive``) into a temporary folder."""
    if args.before_tree:
        yield Path(args.before_tree).resolve()
        return
    folder = Path(tempfile.mkdtemp(prefix=f"hooklane-{args.before}-"))
    try:
        archive = subprocess.Popen(
            ["git", "-C", str(REPO), "archive", args.before, "hooklane"], stdout=subprocess.PIPE
        )
        subprocess.run(["tar", "-x", "-C", str(folder)], stdin=archive.stdout, check=True)
        if archive.wait() != 0:
            raise RuntimeError(f"git archive {args.before} failed")
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def start_api(dsn: str, tree: Path | None, token: str, port: int, metrics_port: int) -> subprocess.Popen:
    env = worker_env(
        dsn,
        api_host="127.0.0.1",
        api_port=str(port),
        api_tokens=token,
        api_drain_seconds="0",
        metrics_port=str(metrics_port),
    )
    return ingest.start_api(env, tree)


def commit_sizes(metrics_port: int) -> dict[str, float]:
    """The API's events-per-commit histogram (sum, count); empty when an
    API does not serve it."""
    with contextlib.suppress(OSError, ValueError):
        return ingest.scrape_commit_sizes(metrics_port)
    return {}


async def ingest_api(server_dsn: str, cfg: Config, tree: Path, variant: str | None) -> dict:
    token = secrets.token_urlsafe(24)
    # Only its seconds and warm-up are read: the options of each run are passed.
    load_cfg = ingest.Config(cfg.ingest_seconds, cfg.ingest_warmup, 0, 0, 0, 0)
    workloads = {
        "single events": {"concurrency": cfg.ingest_clients},
        f"batches of {cfg.batch}": {"concurrency": cfg.ingest_batch_clients, "batch": cfg.batch},
    }
    runs = []
    async with fresh_database(server_dsn, "publish_ingest") as dsn:
        admin = await asyncpg.connect(dsn)
        apis: dict[str, tuple[subprocess.Popen, int, int]] = {}
        try:
            if variant:
                await admin.execute(variant)
            await create_tenant(admin, cfg.endpoints, tenant="t0")
            server = Server(admin.get_server_pid())
            with contextlib.ExitStack() as stack:
                for path, source in (("today", tree), ("function", None)):
                    port, metrics_port = free_ports(2)
                    proc = stack.enter_context(
                        ingest.running(start_api(dsn, source, token, port, metrics_port))
                    )
                    await ingest.wait_listening(f"http://127.0.0.1:{port}", proc)
                    apis[path] = (proc, port, metrics_port)
                for r, workload, path in plan(cfg.ingest_rounds, list(workloads)):
                    proc, port, metrics_port = apis[path]
                    api = psutil.Process(proc.pid)
                    await empty_tables(admin)
                    sizes = commit_sizes(metrics_port)
                    started = time.monotonic()
                    before = (server.cpu(), cpu_seconds(api))
                    result = await ingest.load(
                        f"http://127.0.0.1:{port}", token, load_cfg, **workloads[workload]
                    )
                    pg, api_cpu = (
                        a - b for a, b in zip((server.cpu(), cpu_seconds(api)), before, strict=True)
                    )
                    elapsed = time.monotonic() - started
                    after_sizes = commit_sizes(metrics_port)
                    accepted = result["accepted_total"]
                    stored = await admin.fetchval("SELECT count(*) FROM events")
                    if stored != accepted or set(result["statuses"]) != {"202"}:
                        raise RuntimeError(
                            f"{path}: {accepted} accepted, {stored} stored, {result['statuses']}"
                        )
                    commits = after_sizes.get("count", 0) - sizes.get("count", 0)
                    run = {
                        "round": r,
                        "workload": workload,
                        "path": path,
                        "events_per_s": result["events_per_second"],
                        "postgres_ms_per_event": 1000 * pg / accepted,
                        "api_ms_per_event": 1000 * api_cpu / accepted,
                        "postgres_cores": pg / elapsed,
                        "events_per_commit": (after_sizes["sum"] - sizes["sum"]) / commits
                        if commits
                        else None,
                        "latency_ms": result["latency_ms"],
                        "generator_cpu_share": result["generator_cpu_share"],
                        "accepted": accepted,
                        "load_average": os.getloadavg()[0],
                    }
                    runs.append(run)
                    print(
                        f"ingest {workload:>16} {path:>8}: {run['events_per_s']:7.0f} events/s,"
                        f" postgres {run['postgres_ms_per_event']:.3f} ms/event,"
                        f" api {run['api_ms_per_event']:.3f} ms/event (load {run['load_average']:.1f})",
                        flush=True,
                    )
        finally:
            await admin.close()
    summary = aggregate(runs, ("events_per_s", "postgres_ms_per_event", "api_ms_per_event", "postgres_cores"))
    return {"tree_before": str(tree), "runs": runs, "summary": summary}


# --------------------------------------------------------------------------


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.rounds:
        cfg = replace(cfg, rounds=args.rounds, ingest_rounds=args.rounds)
    if args.seconds:
        cfg = replace(cfg, seconds=args.seconds)
    if args.sizes:
        cfg = replace(cfg, sizes=tuple(int(size) for size in args.sizes.split(",")))
    today, source = before_queries(args)
    parts = set(args.parts.split(","))
    variant = args.variant_sql
    result: dict = {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "tree": tree_state(),
        "today": source,
        "variant": args.variant,
        "load_average_before": os.getloadavg(),
    }
    started = time.monotonic()
    with postgres_server(args.dsn) as server_dsn:
        if "direct" in parts:
            async with fresh_database(server_dsn, "publish_function") as dsn:
                result["direct"] = await direct(dsn, cfg, today, variant)
        if "checks" in parts:
            async with fresh_database(server_dsn, "publish_checks") as dsn:
                result["checks"] = await checks(dsn, cfg, variant)
        if "ingest" in parts:
            with before_tree(args) as tree:
                result["ingest"] = await ingest_api(server_dsn, cfg, tree, variant)
    result["seconds"] = round(time.monotonic() - started, 1)
    result["verdict"] = verdict(result)
    return result


def verdict(result: dict) -> list[dict]:
    """The function's medians over today's, per workload, against the target."""
    found = []
    for part in ("direct", "ingest"):
        for row in result.get(part, {}).get("summary", []):
            if "ratio" not in row:
                continue
            ratio = row["ratio"]
            cost = ratio["postgres_ms_per_event"]
            rate = ratio["events_per_s"]
            found.append(
                {
                    "part": part,
                    "workload": row["workload"],
                    "events_per_s": round(rate, 3),
                    "postgres_ms_per_event": round(cost, 3),
                    "within_target": cost <= TARGET_RATIO and rate >= 1 / TARGET_RATIO,
                }
            )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description="today's publish statements beside the publish function")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument(
        "--dsn", help="a server of this machine to create the databases on (default: LocalPostgres)"
    )
    parser.add_argument(
        "--before", default=BEFORE, help="the commit whose statements and API are today's path"
    )
    parser.add_argument("--before-queries", help="today's queries.sql, instead of the --before commit's")
    parser.add_argument("--before-tree", help="today's source tree for the ingest API, instead of an export")
    parser.add_argument("--parts", default="direct,checks,ingest", help="which parts to run, comma-separated")
    parser.add_argument("--rounds", type=int, help="windows per workload and path, overriding the preset")
    parser.add_argument(
        "--seconds", type=float, help="measured seconds per direct window, overriding the preset"
    )
    parser.add_argument("--sizes", help="bytes of data of the direct workloads, comma-separated (preset's)")
    parser.add_argument(
        "--variant",
        help="SQL run on each database once migrated: a scratch run of a variant"
        " of the functions (CREATE OR REPLACE), never a migration",
    )
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    args.variant_sql = Path(args.variant).read_text() if args.variant else None
    run_and_report(
        main_async, args, lambda result: {"seconds": result["seconds"], "verdict": result["verdict"]}
    )


if __name__ == "__main__":
    main()

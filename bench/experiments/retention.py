"""Retention's cost: one day of history past retention, removed row by row
and by dropping its partition.

For each size N, one database holds three copies of a day's history past
retention, bulk-loaded (the shape is the input here, not how it got
there), with as many endpoints as ``--endpoints``:

- N events, each with one delivered delivery: today's retention of events,
  ``store.purge_events`` (a batched DELETE whose deliveries go with their
  events by the foreign key's cascade);
- N attempts in the default partition of ``delivery_attempts``, the day
  that got no partition of its own: deleted row by row by
  ``hooklane_attempt_partitions``, what every day would cost were the
  history one plain table;
- N attempts in their own daily partition: dropped by the same function.

Each removal is timed from a checkpoint with the WAL it wrote
(``pg_current_wal_insert_lsn``), then the VACUUM that a row-by-row delete leaves
to do, timed and measured the same way. A drop leaves nothing to vacuum.
The throwaway server runs with ``full_page_writes`` off: the WAL figures
are the records alone, and a production server writes more for a
row-by-row delete (a full-page image of each page it first touches after a
checkpoint), nothing more for a drop.

Run: ``python -m bench.experiments.retention --preset full``
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime, timedelta

import asyncpg

from bench.common import SECRET, fresh_database, machine, postgres_server, run_and_report
from hooklane import store

DAY = 86_400.0
# The days of the three copies, in days before now: the events and the
# default partition's rows a day older than the partition to drop, so that
# one retention setting reaches the partition and not yet the other two.
EVENTS_AGE, DEFAULT_AGE, PARTITION_AGE = 35, 35, 40


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]  # rows of each copy of the day
    endpoints: int = 1_000
    purge_batch: int = 1_000  # store.purge_events's own default


PRESETS = {
    "full": Config(sizes=(1_000_000, 10_000_000)),
    "quick": Config(sizes=(100_000, 1_000_000)),
    "smoke": Config(sizes=(10_000,), endpoints=100),
}

ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
SELECT 'bench', 'ep-' || i, 't' || i, 'http://127.0.0.1:9/h/' || i, $2,
       (hashtext('bench/ep-' || i)::bigint & 2147483647) % (SELECT partition_count FROM hooklane_config)
FROM generate_series(0, $1 - 1) i
"""
# A day's events and their delivered deliveries, spread over the day and
# over the endpoints (event g to endpoint g % endpoints, its tenant's).
EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout, created_at)
SELECT 'evt_' || g, 't' || (g % $2), 'order.updated',
       jsonb_build_object('order', g, 'status', 'paid', 'total', 4200), 1,
       $3::timestamptz + (g::float8 / $1) * interval '1 day'
FROM generate_series(0, $1 - 1) g
"""
DELIVERIES = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, attempted_by,
                        next_attempt_at, created_at, delivered_at, last_status)
SELECT ep.id, e.tenant, e.id, 'delivered', 1, 'bench-worker', e.created_at, e.created_at,
       e.created_at + interval '40 milliseconds', 200
FROM events e JOIN endpoints ep ON ep.namespace = 'bench' AND ep.name = 'ep-' || substr(e.tenant, 2)
"""
# A day's attempts: one per delivery of the day, as a worker records them.
ATTEMPTS = """
INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                               attempted_by, started_at, duration_seconds, outcome, status,
                               recorded_at)
SELECT g, 1, (SELECT min(id) FROM endpoints) + g % $2, 't' || (g % $2), 'evt_' || g,
       'bench-worker', at, 0.04, 'delivered', 200, at + interval '50 milliseconds'
FROM generate_series(0, $1 - 1) g,
     LATERAL (SELECT $3::timestamptz + (g::float8 / $1) * interval '1 day' AS at) t
"""


def _midnight(days_ago: int) -> datetime:
    day = (datetime.now(UTC) - timedelta(days=days_ago)).date()
    return datetime(day.year, day.month, day.day, tzinfo=UTC)


async def fill(conn: asyncpg.Connection, rows: int, cfg: Config) -> dict:
    started = time.perf_counter()
    await conn.execute(ENDPOINTS, cfg.endpoints, SECRET)
    await conn.execute(EVENTS, rows, cfg.endpoints, _midnight(EVENTS_AGE))
    await conn.execute(DELIVERIES)
    # The partition of the older day, made as maintenance would have made
    # it then; the younger day's rows, with none, land in the default one.
    day = _midnight(PARTITION_AGE)
    name = f"delivery_attempts_{day:%Y%m%d}"
    await conn.execute(
        f"CREATE TABLE {name} PARTITION OF delivery_attempts"
        f" FOR VALUES FROM ('{day.isoformat()}') TO ('{(day + timedelta(days=1)).isoformat()}')"
    )
    await conn.execute(ATTEMPTS, rows, cfg.endpoints, day)
    await conn.execute(ATTEMPTS, rows, cfg.endpoints, _midnight(DEFAULT_AGE))
    await conn.execute("VACUUM ANALYZE")
    sizes = await conn.fetchrow(
        """SELECT pg_total_relation_size('events') AS events_bytes,
                  pg_total_relation_size('deliveries') AS deliveries_bytes,
                  pg_total_relation_size($1::regclass) AS partition_bytes,
                  pg_total_relation_size('delivery_attempts_default') AS default_bytes""",
        name,
    )
    return {**dict(sizes), "fill_seconds": round(time.perf_counter() - started, 1)}


async def measured(conn: asyncpg.Connection, work: Callable[[], Awaitable[object]]) -> dict:
    """Seconds and WAL bytes of ``work``, from a checkpoint. Measured where
    WAL is inserted: the location written lags it by what the WAL writer has
    not written yet (the tests' server commits asynchronously), which on a
    busy machine was all of a row-by-row delete's."""
    await conn.execute("CHECKPOINT")
    lsn = await conn.fetchval("SELECT pg_current_wal_insert_lsn()")
    started = time.perf_counter()
    done = await work()
    seconds = time.perf_counter() - started
    wal = await conn.fetchval("SELECT pg_wal_lsn_diff(pg_current_wal_insert_lsn(), $1)", lsn)
    return {"seconds": round(seconds, 3), "wal_bytes": int(wal), "done": done}


async def one_size(server: str, rows: int, cfg: Config) -> dict:
    async with fresh_database(server, "retention") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            filled = await fill(conn, rows, cfg)

            async def purge_events() -> int:
                return await store.purge_events(conn, (EVENTS_AGE - 1) * DAY, cfg.purge_batch)

            async def vacuum(*tables: str) -> None:
                await conn.execute(f"VACUUM {', '.join(tables)}")

            async def keep(days: int) -> dict:
                return asdict(await store.keep_attempt_partitions(conn, days * DAY, ahead=0))

            events = await measured(conn, purge_events)
            events_vacuum = await measured(conn, lambda: vacuum("events", "deliveries"))
            dropped = await measured(conn, lambda: keep(PARTITION_AGE - 2))
            deleted = await measured(conn, lambda: keep(DEFAULT_AGE - 2))
            deleted_vacuum = await measured(conn, lambda: vacuum("delivery_attempts_default"))
        finally:
            await conn.close()
    return {
        "rows": rows,
        **filled,
        "events_purge": events,
        "events_vacuum": events_vacuum,
        "attempts_row_by_row": deleted,
        "attempts_row_by_row_vacuum": deleted_vacuum,
        "attempts_partition_drop": dropped,
    }


def _line(r: dict) -> str:
    def cost(*keys: str) -> str:
        seconds = sum(r[k]["seconds"] for k in keys)
        wal = sum(r[k]["wal_bytes"] for k in keys) / 2**20
        return f"{seconds:.2f} s, {wal:.1f} MiB WAL"

    return (
        f"{r['rows']:>10,d} rows: events+deliveries purge {cost('events_purge', 'events_vacuum')}; "
        f"attempts row by row {cost('attempts_row_by_row', 'attempts_row_by_row_vacuum')}; "
        f"attempts partition drop {cost('attempts_partition_drop')}"
    )


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.sizes:
        cfg = replace(cfg, sizes=tuple(args.sizes))
    results = []
    with postgres_server(args.dsn) as server:
        for rows in cfg.sizes:
            r = await one_size(server, rows, cfg)
            print(_line(r), flush=True)
            results.append(r)
    return {"preset": args.preset, "config": asdict(cfg), "machine": machine(), "sizes": results}


def main() -> None:
    parser = argparse.ArgumentParser(description="cost of one day's retention, row by row and by partition")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--dsn", help="a server to create the benchmark database on (default: LocalPostgres)")
    parser.add_argument("--sizes", type=int, action="append", help="rows of the day (repeatable)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

"""Fan-out cost: one publish to every endpoint of a tenant with thousands.

A database gets ``--endpoints`` endpoints of one tenant by bulk INSERT, with
autovacuum off for the table and no ANALYZE: the planner's statistics of
``endpoints`` are those of a fresh table, as after an operator applied
thousands of WebhookEndpoints before autovacuum got to it. Then the
``publish`` statement is timed (each run committed, then the events,
deliveries and wakeups it wrote are truncated, so that every run sees the
same tables), first with those stale statistics, then after ``ANALYZE
endpoints``. Each run also reports the most rows one node of its plan
handled (rows x loops, from EXPLAIN ANALYZE of one more run): a nested loop
over the statement's CTEs shows as endpoints squared.

``--queries`` takes the statement from another tree's queries.sql (e.g. a
checkout of an older commit), on a database migrated by this one: its
migrations only add to what older statements need.

Run: ``python -m bench.fanout --preset full``; before a change:
``python -m bench.fanout --queries ../main/hooklane/store/queries.sql``
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import uuid
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import asyncpg

from bench.common import SECRET, fresh_database, machine, postgres_server, run_and_report
from hooklane import store
from hooklane.store.queries import QUERIES, Query, load
from testsupport.databases import nested_plans

TENANT = "bench"


@dataclass(frozen=True)
class Config:
    endpoints: int
    repeat: int  # timed publishes per state of the statistics


PRESETS = {
    "full": Config(endpoints=10_000, repeat=5),
    "smoke": Config(endpoints=1_000, repeat=2),
}

ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
SELECT 'bench', 'ep-' || i, $2, 'http://127.0.0.1:9/h/' || i, $3,
       -- the same stable hash as upsert_endpoint
       (hashtext('bench/ep-' || i)::bigint & 2147483647) % (SELECT partition_count FROM hooklane_config)
FROM generate_series(1, $1) i
"""


def most_rows(plan: dict) -> int:
    """The most rows (rows x loops) one node of an EXPLAIN ANALYZE plan
    handled, its init plans and sub-plans included."""
    own = plan["Actual Rows"] * plan["Actual Loops"]
    return max([own, *(most_rows(child) for child in plan.get("Plans", []))])


def publish_statement(source: Path | None) -> Query:
    """This tree's publish statement, or that of the queries.sql at ``source``."""
    if source is None:
        return QUERIES["publish"]
    text = source.read_text()
    if "%(" in text:
        return load(text)["publish"]
    # A tree from before named parameters numbers them itself, in this order.
    return Query(
        "publish", store.parse_queries(text)["publish"], ("id", "tenant", "type", "data", "coalesce_key")
    )


def event(statement: Query) -> tuple[object, ...]:
    """The arguments of one publish of a new event."""
    values: dict[str, object] = {
        "id": f"e-{uuid.uuid4().hex}",
        "tenant": TENANT,
        "type": "order.created",
        "data": "{}",
        "coalesce_key": None,
    }
    # Unordered, where the statement knows of ordering keys and traces.
    for param in ("traceparent", "ordering_key"):
        if param in statement.params:
            values[param] = None
    return statement.args(**values)


async def publish_once(conn: asyncpg.Connection, statement: Query) -> tuple[float, int]:
    """Seconds one publish took, and its fan-out."""
    started = time.perf_counter()
    row = await conn.fetchrow(statement.sql, *event(statement))
    elapsed = time.perf_counter() - started
    await conn.execute("TRUNCATE wakeups, deliveries, events")
    assert row is not None
    return elapsed, row["fanout"]


async def measure(conn: asyncpg.Connection, statement: Query, repeat: int) -> dict:
    """Timed publishes, then the plan of one more."""
    seconds, fanouts = [], set()
    for _ in range(repeat):
        elapsed, fanout = await publish_once(conn, statement)
        seconds.append(elapsed)
        fanouts.add(fanout)
    # The function's statements, where the statement is a call of it.
    plans = await nested_plans(conn, lambda: conn.fetchrow(statement.sql, *event(statement)))
    await conn.execute("TRUNCATE wakeups, deliveries, events")
    estimate = await conn.fetchval("SELECT reltuples FROM pg_class WHERE oid = 'endpoints'::regclass")
    return {
        "reltuples": estimate,
        "fanout": sorted(fanouts),
        "median_ms": statistics.median(seconds) * 1000,
        "min_ms": min(seconds) * 1000,
        "max_ms": max(seconds) * 1000,
        "most_rows_in_one_node": max(most_rows(plan) for plan in plans),
    }


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.endpoints:
        cfg = replace(cfg, endpoints=args.endpoints)
    if args.repeat:
        cfg = replace(cfg, repeat=args.repeat)
    source = Path(args.queries) if args.queries else None
    statement = publish_statement(source)
    with postgres_server(args.dsn) as server:
        async with fresh_database(server, "fanout") as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                await conn.execute("ALTER TABLE endpoints SET (autovacuum_enabled = off)")
                await conn.execute(ENDPOINTS, cfg.endpoints, TENANT, SECRET)
                stale = await measure(conn, statement, cfg.repeat)
                print(f"stale statistics: {json.dumps(stale)}", flush=True)
                await conn.execute("ANALYZE endpoints")
                fresh = await measure(conn, statement, cfg.repeat)
                print(f"fresh statistics: {json.dumps(fresh)}", flush=True)
            finally:
                await conn.close()
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "queries": str(source or "this tree"),
        "machine": machine(),
        "stale": stale,
        "fresh": fresh,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="one publish fanning out to thousands of endpoints")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--dsn", help="a server to create the benchmark database on (default: LocalPostgres)")
    parser.add_argument("--endpoints", type=int, help="endpoints of the tenant, overriding the preset")
    parser.add_argument("--repeat", type=int, help="timed publishes per state, overriding the preset")
    parser.add_argument("--queries", help="take the publish statement from this queries.sql")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

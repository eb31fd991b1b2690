"""Candidate changes to ``reserve``, timed on the same data as reservation.py.

Not Hooklane code: each variant is the committed statement with one change,
so that a proposal for the core comes with a measured gain. Every variant
returns the same rows as the original on this data (checked).

- ``as_is``: the committed statement.
- ``jit_off``: the same, with ``SET LOCAL jit = off``: at 10,000+ endpoints
  the planner's cost estimate crosses jit_above_cost and each call pays for
  compiling expressions it runs once.
- ``count_per_endpoint``: the in-flight count taken per candidate endpoint
  (deliveries_in_flight index) instead of aggregating every sending row of
  the database first.
- ``both``: the two together.
- ``ready_set``: the lower bound of keeping a set of ready endpoints (those
  with due deliveries and free slots, not paused), as the core's next
  migration plans: the statement visits only the endpoints of that set,
  here a table filled before timing. Maintaining the set is not timed.

Run: ``python -m bench.reservation_variants --preset full``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time

import asyncpg

from bench.common import fresh_database, postgres_server, write_json
from bench.reservation import PRESETS, fill
from hooklane.store.queries import QUERIES

_IN_FLIGHT_CTE = """WITH in_flight AS (
    SELECT d.endpoint_id, count(*) AS n
    FROM deliveries d
    WHERE d.state = 'sending'
    GROUP BY d.endpoint_id
),
candidates AS ("""
_JOIN = "    LEFT JOIN in_flight f ON f.endpoint_id = ep.id\n"
_LIMIT = "LIMIT greatest(ep.max_concurrency - coalesce(f.n, 0), 0)"
_LIMIT_PER_ENDPOINT = (
    "LIMIT greatest(ep.max_concurrency - (SELECT count(*) FROM deliveries f"
    " WHERE f.endpoint_id = ep.id AND f.state = 'sending'), 0)"
)


def count_per_endpoint(sql: str) -> str:
    for old in (_IN_FLIGHT_CTE, _JOIN, _LIMIT):
        if old not in sql:
            raise RuntimeError("the reserve statement changed; update this variant")
    return sql.replace(_IN_FLIGHT_CTE, "WITH candidates AS (").replace(_JOIN, "").replace(_LIMIT, _LIMIT_PER_ENDPOINT)


_OWNED = "WHERE ep.partition = ANY($1::int[])"
READY_SET = """
CREATE TABLE IF NOT EXISTS bench_ready AS
SELECT DISTINCT d.endpoint_id FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
WHERE d.state = 'pending' AND d.next_attempt_at <= now() AND NOT ep.paused
  AND (ep.paused_until IS NULL OR ep.paused_until <= now())
  AND ep.max_concurrency > (SELECT count(*) FROM deliveries f
                            WHERE f.endpoint_id = ep.id AND f.state = 'sending');
ANALYZE bench_ready;
"""


def ready_set(sql: str) -> str:
    if _OWNED not in sql:
        raise RuntimeError("the reserve statement changed; update this variant")
    return sql.replace(_OWNED, _OWNED + " AND ep.id IN (SELECT endpoint_id FROM bench_ready)")


VARIANTS = {
    "as_is": (QUERIES["reserve"], False),
    "jit_off": (QUERIES["reserve"], True),
    "count_per_endpoint": (count_per_endpoint(QUERIES["reserve"]), False),
    "both": (count_per_endpoint(QUERIES["reserve"]), True),
    "ready_set": (ready_set(QUERIES["reserve"]), True),
}


async def time_variant(conn: asyncpg.Connection, sql: str, jit_off: bool, repeat: int) -> tuple[float, list[int]]:
    partitions = list(range(await conn.fetchval("SELECT partition_count FROM hooklane_config")))
    stmt = await conn.prepare(sql)
    times, ids = [], []
    for _ in range(repeat + 1):
        tx = conn.transaction()
        await tx.start()
        if jit_off:
            await conn.execute("SET LOCAL jit = off")
        started = time.perf_counter()
        rows = await stmt.fetch(partitions, 64, 10.0)
        times.append(time.perf_counter() - started)
        await tx.rollback()
        ids = sorted(r["id"] for r in rows)
    return statistics.median(times[1:]) * 1000, ids


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    out = {}
    with postgres_server(args.dsn) as server:
        for n in cfg.sizes:
            async with fresh_database(server, "variants") as dsn:
                conn = await asyncpg.connect(dsn)
                try:
                    await fill(conn, n, cfg)
                    await conn.execute(READY_SET)
                    row: dict[str, float] = {}
                    reference = None
                    for name, (sql, jit_off) in VARIANTS.items():
                        ms, ids = await time_variant(conn, sql, jit_off, cfg.repeat)
                        reference = reference if reference is not None else ids
                        if ids != reference:
                            raise RuntimeError(f"{name} reserves other rows than the committed statement")
                        row[name] = round(ms, 2)
                finally:
                    await conn.close()
            print(n, row, flush=True)
            out[str(n)] = row
    return {"preset": args.preset, "median_ms": out}


def main() -> None:
    parser = argparse.ArgumentParser(description="candidate reserve statements, timed")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    result = asyncio.run(main_async(args))
    print(json.dumps(result, indent=2))
    if args.json:
        write_json(args.json, result)


if __name__ == "__main__":
    main()

"""The endpoint charts' statement (issue 41) at 10,000 endpoints and
millions of attempts: what one page view's chart costs, for a busy
endpoint, a typical one and a quiet one, over 24 hours and over 7 days.

A database gets ``--endpoints`` endpoints and ``--attempts`` attempt rows
recorded over the last 7 days by bulk INSERT, in time order as the
workers append them (so that one endpoint's rows lie scattered over the
pages, as they do), each day in its own daily partition as the worker's
maintenance makes them: ``--busy`` of them the busy endpoint's, ten the
quiet one's, the rest spread over the others; most delivered, some
retried, dead or discarded, a few untimed (leases that ran out). Then
VACUUM (FREEZE, ANALYZE), as autovacuum leaves the days before today in
the end (a plain VACUUM right after the bulk load left half the pages of
some partitions out of the visibility map, whose rows an index-only scan
then reads from the table anyway). Then ``endpoint_chart``
(store.endpoint_chart, a prepared statement as the API runs it) ``--runs``
times for each endpoint and span: p50, p99 and max, and the EXPLAIN
(ANALYZE, BUFFERS) of each.

Measured twice: with migration 0025's index, which holds what the
charts read (endpoint_id, recorded_at) INCLUDE (outcome, duration_seconds),
and with 0010's (endpoint_id, recorded_at) alone, as before it; then the
migration's statements are run on this history, timed: how long they hold
their locks.

Run: ``python -m bench.experiments.charts --preset full``.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import asdict, dataclass, replace

import asyncpg

from bench.common import REPO, fresh_database, machine, postgres_server, run_and_report, summary
from hooklane import charts, store
from hooklane.store.queries import QUERIES

MIGRATION = REPO / "hooklane/store/migrations/0025_attempt_chart_index.sql"


@dataclass(frozen=True)
class Config:
    endpoints: int
    attempts: int
    busy: int
    runs: int


PRESETS = {
    "smoke": Config(endpoints=300, attempts=30_000, busy=3_000, runs=3),
    "full": Config(endpoints=10_000, attempts=4_000_000, busy=100_000, runs=30),
}
BUSY, QUIET, TYPICAL = "ep-0", "ep-1", "ep-2"


async def populate(dsn: str, cfg: Config) -> None:
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """
            INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
            SELECT 'default', 'ep-' || i, 't' || (i % 100), 'https://receiver.example/' || i, 'whsec_x',
                   (hashtext('default/ep-' || i)::bigint & 2147483647)
                     % (SELECT partition_count FROM hooklane_config)
            FROM generate_series(0, $1 - 1) AS i
            """,
            cfg.endpoints,
        )
        # The daily partitions of the last week, as maintenance made each
        # on its day (the migration made today's and the next days').
        await conn.execute(
            """
            DO $$
            DECLARE day date;
            BEGIN
                FOR i IN 1..7 LOOP
                    day := (now() AT TIME ZONE 'UTC')::date - i;
                    EXECUTE format('CREATE TABLE IF NOT EXISTS %I PARTITION OF delivery_attempts'
                                   ' FOR VALUES FROM (%L) TO (%L)',
                                   'delivery_attempts_' || to_char(day, 'YYYYMMDD'),
                                   day::timestamp AT TIME ZONE 'UTC',
                                   (day + 1)::timestamp AT TIME ZONE 'UTC');
                END LOOP;
            END $$
            """
        )
        ids = {
            r["name"]: r["id"]
            for r in await conn.fetch(
                "SELECT name, id FROM endpoints WHERE name = ANY($1::text[])", [BUSY, QUIET]
            )
        }
        # Row n of N, recorded at now() - 7 days + n * 7 days / N: every
        # `every`th the busy endpoint's, ten spread out the quiet one's,
        # the others' (ep-2, the typical one, among them: ids follow the
        # names) by a hash of n.
        every = max(1, cfg.attempts // cfg.busy)
        quiet_every = cfg.attempts // 10
        await conn.execute(
            """
            INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                           attempted_by, started_at, duration_seconds, outcome,
                                           status, failure, error, recorded_at)
            SELECT n, 1, e.endpoint_id, 't0', 'ev-' || n, 'worker-' || (n % 3), r.at,
                   CASE WHEN n % 211 = 0 THEN NULL
                        ELSE 0.02 + 2.0 * power((hashint8(n) & 65535) / 65536.0, 4) END,
                   CASE WHEN n % 100 < 90 THEN 'delivered' WHEN n % 100 < 98 THEN 'retry'
                        WHEN n % 200 < 199 THEN 'dead' ELSE 'discarded' END,
                   CASE WHEN n % 211 = 0 THEN NULL WHEN n % 100 < 90 THEN 204 ELSE 503 END,
                   CASE WHEN n % 211 = 0 THEN 'lease_expired' END,
                   CASE WHEN n % 100 >= 90 THEN 'HTTP 503' END,
                   r.at
            FROM generate_series(0, $1 - 1) AS n
            CROSS JOIN LATERAL (SELECT now() - interval '7 days' + n * interval '7 days' / $1 AS at) r
            CROSS JOIN LATERAL (
                SELECT CASE WHEN n % $2 = 0 THEN $4::bigint
                            WHEN n % $3 = 1 THEN $5::bigint
                            ELSE (SELECT min(id) FROM endpoints)
                                 + 2 + (hashint8(n) & 2147483647) % ($6 - 2) END AS endpoint_id
            ) e
            ORDER BY n
            """,
            cfg.attempts,
            every,
            quiet_every,
            ids[BUSY],
            ids[QUIET],
            cfg.endpoints,
        )
        await conn.execute("VACUUM (FREEZE, ANALYZE) delivery_attempts")
    finally:
        await conn.close()


async def measure(conn: asyncpg.Connection, runs: int) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    for name in (BUSY, TYPICAL, QUIET):
        for span in charts.Span:
            seconds = []
            for _ in range(runs):
                started = time.perf_counter()
                found = await store.endpoint_chart(conn, "default", name, span)
                seconds.append(time.perf_counter() - started)
            assert found is not None
            terms = charts.SPANS[span]
            query = QUERIES["endpoint_chart"]
            plan = await conn.fetch(
                "EXPLAIN (ANALYZE, BUFFERS) " + query.sql,
                *query.args(
                    namespace="default",
                    name=name,
                    bucket_seconds=terms.width.total_seconds(),
                    buckets=terms.count,
                ),
            )
            results.append(
                {
                    "endpoint": name,
                    "span": str(span),
                    "attempts": sum(b.total for b in found),
                    "seconds": summary(seconds),
                    "plan": [r[0] for r in plan],
                }
            )
    return results


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(
        cfg, **{k: v for k in ("endpoints", "attempts", "runs") if (v := getattr(args, k)) is not None}
    )
    result: dict = {"config": asdict(cfg), "machine": machine()}
    with postgres_server(args.dsn) as server:
        async with fresh_database(server, "charts") as dsn:
            started = time.perf_counter()
            await populate(dsn, cfg)
            result["populate_seconds"] = time.perf_counter() - started
            conn = await asyncpg.connect(dsn)
            try:
                result["rows"] = await conn.fetchval("SELECT count(*) FROM delivery_attempts")
                result["size"] = await conn.fetchval(
                    "SELECT pg_size_pretty(sum(pg_total_relation_size(c.oid)))"
                    " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
                    " WHERE i.inhparent = 'delivery_attempts'::regclass"
                )
                result["with 0025's index"] = await measure(conn, cfg.runs)
                # As before migration 0025: the keys alone, each row read
                # from the table.
                await conn.execute("DROP INDEX delivery_attempts_endpoint_chart")
                await conn.execute(
                    "CREATE INDEX delivery_attempts_endpoint ON delivery_attempts (endpoint_id, recorded_at)"
                )
                await conn.execute("VACUUM (FREEZE, ANALYZE) delivery_attempts")
                result["with 0010's index"] = await measure(conn, cfg.runs)
                # Migration 0025's statements on this history, timed.
                started = time.perf_counter()
                await conn.execute(MIGRATION.read_text())
                result["migration 0025 seconds"] = time.perf_counter() - started
            finally:
                await conn.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="smoke")
    parser.add_argument("--dsn", help="a server to create the database on (default: a throwaway one)")
    parser.add_argument("--endpoints", type=int)
    parser.add_argument("--attempts", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

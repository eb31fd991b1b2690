"""The ordering sweep (migration 0027) at 1,000 to 100,000 outstanding
keys: how long one statement holds the worker's partition-lock connection,
which every reservation of the worker waits for, with v1 (every
outstanding key of the partitions in one statement) and v2 (a page of
keys after a cursor), and what a whole walk of v2's pages costs.

A database gets ``--endpoints`` endpoints over the 32 partitions and, for
each size in ``--keys``, that many ordering keys spread over them, each
with its head delivery pending as most keys are (the steady state: a
sweep finds nothing to do), and one key in a hundred whose head was
recorded delivered without the key moving on, which the sweep repairs
(each such key has a second delivery waiting behind it). Written by bulk
INSERT, then VACUUM ANALYZE. Each call runs in a transaction rolled back,
so that every run finds the same keys to repair; ``--runs`` calls each,
as the worker runs them (prepared, asyncpg), owning every partition and
owning a quarter of them (a worker of four).

Run: ``python -m bench.experiments.ordering_sweep --preset full``.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace

import asyncpg

from bench.common import fresh_database, machine, postgres_server, run_and_report, summary

ALL = list(range(32))
QUARTER = list(range(8))
V1 = "SELECT * FROM hooklane_ordering_sweep_v1($1::int[], $2)"
V2 = "SELECT * FROM hooklane_ordering_sweep_v2($1::int[], $2::bigint, $3::text, $4::int)"
# The worker's: v1's max_keys as the release before called it, v2's page.
MAX_KEYS = 1000
PAGE = 1000


@dataclass(frozen=True)
class Config:
    endpoints: int
    keys: tuple[int, ...]
    runs: int


PRESETS = {
    "smoke": Config(endpoints=100, keys=(1_000, 3_000), runs=3),
    "full": Config(endpoints=1_000, keys=(1_000, 10_000, 100_000), runs=20),
}


async def populate(conn: asyncpg.Connection, endpoints: int, keys: int) -> None:
    await conn.execute("TRUNCATE endpoints, events, deliveries, ordering_keys CASCADE")
    await conn.execute(
        """
        INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
        SELECT 'default', 'ep-' || i, 't', 'https://receiver.example/' || i, 'whsec_x', i % 32
        FROM generate_series(0, $1 - 1) AS i
        """,
        endpoints,
    )
    # Key n belongs to endpoint n % endpoints; one in a hundred, by a hash
    # of n, is stale (its head delivered, the next waiting behind it).
    await conn.execute(
        """
        INSERT INTO events (id, tenant, type, data, fanout, ordering_key)
        SELECT 'ev-' || n || '-' || s, 't', 'order.updated', '{}', 1, 'key-' || n
        FROM generate_series(0, $1 - 1) AS n
        CROSS JOIN generate_series(1, CASE WHEN hashint4(n) % 100 = 0 THEN 2 ELSE 1 END) AS s
        """,
        keys,
    )
    await conn.execute(
        """
        INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, next_attempt_at,
                                ordering_key, ordering_seq)
        SELECT ep.id, 't', 'ev-' || n || '-' || s,
               CASE WHEN s = 1 AND hashint4(n) % 100 = 0 THEN 'delivered' ELSE 'pending' END,
               CASE WHEN s = 2 THEN 'infinity' ELSE now() END,
               'key-' || n, s
        FROM generate_series(0, $1 - 1) AS n
        CROSS JOIN generate_series(1, CASE WHEN hashint4(n) % 100 = 0 THEN 2 ELSE 1 END) AS s
        JOIN endpoints ep ON ep.name = 'ep-' || (n % $2)
        """,
        keys,
        endpoints,
    )
    await conn.execute(
        """
        INSERT INTO ordering_keys (endpoint_id, key, last_seq, head_seq)
        SELECT ep.id, 'key-' || n, CASE WHEN hashint4(n) % 100 = 0 THEN 2 ELSE 1 END, 1
        FROM generate_series(0, $1 - 1) AS n
        JOIN endpoints ep ON ep.name = 'ep-' || (n % $2)
        """,
        keys,
        endpoints,
    )
    await conn.execute("VACUUM ANALYZE endpoints, events, deliveries, ordering_keys")


async def rolled_back(conn: asyncpg.Connection, call: Callable[[], Awaitable[int]]) -> tuple[float, int]:
    """Seconds ``call`` took and what it returned, in a transaction rolled back."""
    tx = conn.transaction()
    await tx.start()
    try:
        started = time.perf_counter()
        found = await call()
        return time.perf_counter() - started, found
    finally:
        await tx.rollback()


async def measure(conn: asyncpg.Connection, owned: list[int], runs: int) -> dict:
    v1 = await conn.prepare(V1)
    v2 = await conn.prepare(V2)

    async def call_v1() -> int:
        return sum(1 for r in await v1.fetch(owned, MAX_KEYS) if r["due"] is not None)

    first_page, walks, pages, woken = [], [], 0, 0
    v1_seconds, v1_woken = [], 0
    for _ in range(runs):
        seconds, v1_woken = await rolled_back(conn, call_v1)
        v1_seconds.append(seconds)
    for _ in range(runs):
        tx = conn.transaction()
        await tx.start()
        try:
            after: tuple[int, str] | None = None
            walk, pages, woken = [], 0, 0
            while True:
                started = time.perf_counter()
                row = await v2.fetchrow(owned, *(after or (None, None)), PAGE)
                walk.append(time.perf_counter() - started)
                pages += 1
                woken += len(row["woken_endpoints"] or [])
                if row["next_endpoint"] is None:
                    break
                after = (row["next_endpoint"], row["next_key"])
        finally:
            await tx.rollback()
        first_page.append(walk[0])
        walks.append(sum(walk))
    plan = await conn.fetch(
        "EXPLAIN (ANALYZE, BUFFERS)"
        " SELECT k.endpoint_id, k.key FROM ordering_keys k JOIN endpoints ep ON ep.id = k.endpoint_id"
        " WHERE k.head_seq IS NOT NULL AND ep.partition = ANY($1::int[])"
        " AND (k.endpoint_id, k.key) > (-1, '') ORDER BY k.endpoint_id, k.key LIMIT $2",
        owned,
        PAGE,
    )
    return {
        "v1 statement seconds": summary(v1_seconds),
        "v1 woken": v1_woken,
        "v2 first page seconds": summary(first_page),
        "v2 whole walk seconds": summary(walks),
        "v2 pages a walk": pages,
        "v2 woken a walk": woken,
        "v2 page plan": [r[0] for r in plan],
    }


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(cfg, **{k: v for k in ("endpoints", "runs") if (v := getattr(args, k)) is not None})
    if args.keys:
        cfg = replace(cfg, keys=tuple(args.keys))
    result: dict = {"config": asdict(cfg), "machine": machine(), "sizes": []}
    with postgres_server(args.dsn) as server:
        async with fresh_database(server, "ordering_sweep") as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                for keys in cfg.keys:
                    await populate(conn, cfg.endpoints, keys)
                    size: dict = {"keys": keys}
                    for label, owned in (("every partition", ALL), ("a quarter", QUARTER)):
                        size[label] = await measure(conn, owned, cfg.runs)
                    # Migration 0027's index, built on these keys.
                    await conn.execute("DROP INDEX ordering_keys_outstanding_keys")
                    started = time.perf_counter()
                    await conn.execute(
                        "CREATE INDEX ordering_keys_outstanding_keys ON ordering_keys (endpoint_id, key)"
                        " WHERE head_seq IS NOT NULL"
                    )
                    size["index build seconds"] = time.perf_counter() - started
                    result["sizes"].append(size)
            finally:
                await conn.close()
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="smoke")
    parser.add_argument("--dsn", help="a server to create the database on (default: a throwaway one)")
    parser.add_argument("--endpoints", type=int)
    parser.add_argument("--keys", type=int, action="append", help="outstanding keys (repeatable)")
    parser.add_argument("--runs", type=int)
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

"""Reservation cost: the ``reserve`` statement as the endpoint count grows.

For each endpoint count, a database is filled by bulk INSERT (not publish:
the shape of the queue is the input here, not how it got there) with
``--pending`` pending deliveries in all, spread like a busy platform:

- 1% of endpoints have due deliveries (20 each, more than their limit);
- 10% are paused by hand and 10% have an open circuit (``paused_until`` in
  the future), with due deliveries that must not be reserved;
- 10% are at their limit: 4 deliveries in flight, due deliveries waiting;
- the rest (69%) hold pending deliveries that are not due yet (retries).

``--finished N`` adds N delivered deliveries spread over every endpoint,
the history a platform keeps for its retention, and each size is then
timed without and with them side by side: what reservation pays for the
finished rows beside the queue.

``--rate-limited R`` times each size once more with every endpoint
rate-limited at R starts a second (spec.delivery.rateLimit, issue 23),
its in-flight and finished deliveries holding its bucket (``rate_tat``, in
the ``deliveries_rate`` index): what a round pays for the bucket of each
rate-limited candidate, beside the same queue unlimited.

``--versions`` times, beside ``reserve`` (hooklane_reserve_v7, no tenant
ceiling) and in turn with it on the same candidates, ``reserve`` with a
tenant ceiling: above the tenant's
calls in flight (every endpoint is one tenant's, so its count reads all
of them, the ceiling's worst case) and below them (the tenant held: the
count stops at the ceiling, nothing is granted).

Then ``reserve`` is timed as one worker owning every partition runs it, for
as many slots as a worker with the default concurrency has (64), inside a
transaction that is rolled back so every repetition sees the same state.
The worker's ready list is first brought to where a running worker keeps
it: every endpoint with pending deliveries visited once (rounds that
reserve nothing), so that each waits for its next retry, the end of its
pause or a lease, or is due now with its queue's floor at its head; the
timed rounds then take the candidates that list hands out.
The plan of one run (EXPLAIN ANALYZE, BUFFERS) is kept to show where the
time goes.

Run: ``python -m bench.reservation --preset full``
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, replace
from datetime import UTC, datetime
from pathlib import Path

import asyncpg

from bench.common import (
    SECRET,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
)
from hooklane import store
from hooklane.worker.ready import Candidate, ReadyList


@dataclass(frozen=True)
class Config:
    sizes: tuple[int, ...]  # endpoint counts
    pending: int  # pending deliveries in all, at every size
    repeat: int  # timed runs per size
    due_per_endpoint: int = 20
    finished: int = 0  # delivered deliveries beside the queue
    rate_limited: int = 0  # every endpoint's rateLimit.perSecond (0: none)
    limit: int = 64  # slots asked for: a default worker's concurrency
    lease_grace: float = 10.0
    versions: bool = False  # also with tenant ceilings, in turn


# The name the reservations record in deliveries.attempted_by.
WORKER_ID = "bench-reservation"

PRESETS = {
    "full": Config(sizes=(1_000, 10_000, 100_000), pending=1_000_000, repeat=30),
    "quick": Config(sizes=(1_000, 10_000, 100_000), pending=200_000, repeat=15),
    "smoke": Config(sizes=(1_000, 5_000), pending=20_000, repeat=5),
}

# Endpoint i's role, by i % 100: 0 due; 1-10 paused by hand; 11-20 circuit
# open; 21-30 at their limit; the rest not due.
ENDPOINTS = """
INSERT INTO endpoints (namespace, name, tenant, url, secret, partition, paused, paused_until,
                       consecutive_failures)
SELECT 'bench', 'ep-' || i, 't0', 'http://127.0.0.1:9/h/' || i, $2,
       -- the same stable hash as upsert_endpoint
       (hashtext('bench/ep-' || i)::bigint & 2147483647) % (SELECT partition_count FROM hooklane_config),
       i % 100 BETWEEN 1 AND 10,
       CASE WHEN i % 100 BETWEEN 11 AND 20 THEN now() + interval '1 hour' END,
       CASE WHEN i % 100 BETWEEN 11 AND 20 THEN 20 ELSE 0 END
FROM generate_series(0, $1 - 1) i
"""
ROLES = """
CREATE TEMP TABLE roles AS
SELECT ep.id,
       CASE WHEN i % 100 = 0 THEN 'due'
            WHEN i % 100 BETWEEN 1 AND 20 THEN 'paused'
            WHEN i % 100 BETWEEN 21 AND 30 THEN 'full'
            ELSE 'later' END AS role,
       row_number() OVER (ORDER BY ep.id) - 1 AS k
FROM endpoints ep, LATERAL (SELECT substr(ep.name, 4)::int AS i) x
"""
EVENTS = """
INSERT INTO events (id, tenant, type, data, fanout)
SELECT 'evt_' || g, 't0', 'order.updated', jsonb_build_object('n', g), 1
FROM generate_series(0, 999) g
"""
DUE = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, next_attempt_at)
SELECT r.id, 't0', 'evt_' || (g % 1000), now() - g * interval '1 second'
FROM roles r, generate_series(1, $1) g
WHERE r.role = 'due'
"""
IN_FLIGHT = """
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, reserved_at, lease_expires_at)
SELECT r.id, 't0', 'evt_' || g, 'sending', 1, now(), now() + interval '15 seconds'
FROM roles r, generate_series(1, 4) g
WHERE r.role = 'full'
"""
# The rest of the pending rows, spread evenly over every endpoint that is
# not 'due': due (but blocked) for the paused and the full, later for the rest.
REST = """
WITH others AS (
    SELECT id, role, row_number() OVER (ORDER BY id) - 1 AS k FROM roles WHERE role <> 'due'
), n AS (SELECT count(*) AS c FROM others)
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, next_attempt_at, attempts)
SELECT o.id, 't0', 'evt_' || (g % 1000),
       CASE WHEN o.role = 'later' THEN now() + (60 + g % 21600) * interval '1 second'
            ELSE now() - interval '1 minute' END,
       CASE WHEN o.role = 'later' THEN 1 ELSE 0 END
FROM generate_series(0, $1 - 1) g, n, others o
WHERE o.k = g % n.c
"""

# Delivered deliveries of the last days, spread evenly over every endpoint.
FINISHED = """
WITH n AS (SELECT count(*) AS c FROM roles)
INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts, next_attempt_at,
                        created_at, delivered_at, last_status)
SELECT r.id, 't0', 'evt_' || (g % 1000), 'delivered', 1, at, at, at + interval '40 milliseconds', 200
FROM generate_series(0, $1 - 1) g, n, roles r,
     LATERAL (SELECT now() - (g % 2592000) * interval '1 second' AS at) t
WHERE r.k = g % n.c
"""

# Every endpoint rate-limited, its bucket in the deliveries it was granted:
# the finished ones at their start, those in flight just ahead of now.
RATE_LIMITED = """
WITH limited AS (UPDATE endpoints SET rate_per_second = $1)
UPDATE deliveries SET rate_tat = CASE WHEN state = 'sending' THEN now() + interval '30 milliseconds'
                                      ELSE delivered_at - interval '40 milliseconds' END
WHERE state IN ('sending', 'delivered')
"""


async def fill(conn: asyncpg.Connection, endpoints: int, cfg: Config) -> dict:
    started = time.perf_counter()
    await conn.execute(ENDPOINTS, endpoints, SECRET)
    await conn.execute(ROLES)
    await conn.execute(EVENTS)
    await conn.execute(DUE, cfg.due_per_endpoint)
    await conn.execute(IN_FLIGHT)
    due = await conn.fetchval("SELECT count(*) FROM deliveries WHERE state = 'pending'")
    await conn.execute(REST, cfg.pending - due)
    if cfg.finished:
        await conn.execute(FINISHED, cfg.finished)
    if cfg.rate_limited:
        await conn.execute(RATE_LIMITED, cfg.rate_limited)
    if cfg.versions:
        # the calls in flight still live when the rounds count them (a
        # large fill takes longer than their 15 s), as a ceiling counts
        # live leases only
        await conn.execute(
            "UPDATE deliveries SET lease_expires_at = now() + interval '1 hour' WHERE state = 'sending'"
        )
    await conn.execute("VACUUM ANALYZE")
    counts = await conn.fetchrow(
        """SELECT count(*) FILTER (WHERE state = 'pending') AS pending,
                  count(*) FILTER (WHERE state = 'sending') AS sending,
                  count(*) FILTER (WHERE state = 'pending' AND next_attempt_at <= now()) AS due_rows,
                  count(*) FILTER (WHERE state = 'delivered') AS delivered
           FROM deliveries"""
    )
    return {**dict(counts), "fill_seconds": round(time.perf_counter() - started, 1)}


async def _partitions(conn: asyncpg.Connection) -> list[int]:
    return list(range(await conn.fetchval("SELECT partition_count FROM hooklane_config")))


async def _reserve(
    conn: asyncpg.Connection,
    candidates: list[Candidate],
    limit: int,
    cfg: Config,
    tenant_ceiling: int | None = None,
) -> store.Reservation:
    return await store.reserve(
        conn,
        await _partitions(conn),
        [c.endpoint_id for c in candidates],
        [c.floor for c in candidates],
        limit,
        cfg.lease_grace,
        WORKER_ID,
        tenant_ceiling=tenant_ceiling,
    )


async def settled_candidates(conn: asyncpg.Connection, cfg: Config) -> list[Candidate]:
    """The candidates of a worker's round once its ready list has visited
    every endpoint: rounds that reserve nothing (limit 0) over all of them,
    a thousand at a time, then what the list hands out now."""
    ready = ReadyList()
    now = datetime.now(UTC)
    for endpoint_id, partition, head in (
        await store.pending_endpoints(conn, await _partitions(conn))
    ).endpoints:
        ready.listed(endpoint_id, partition, head, now)
    visited: set[int] = set()
    while batch := ready.take(datetime.now(UTC), 1000):
        if visited.issuperset(c.endpoint_id for c in batch):
            # all visited once: what is due again is the timed round's
            ready.returned(batch, datetime.now(UTC))
            break
        reservation = await _reserve(conn, batch, 0, cfg)
        ready.settle(reservation.verdicts, [], datetime.now(UTC))
        visited.update(c.endpoint_id for c in batch)
    return ready.take(datetime.now(UTC), cfg.limit)


async def time_reserve(conn: asyncpg.Connection, cfg: Config) -> dict:
    """Wall time of one reservation, client side, rolled back each time.
    Through store.reserve, the worker's own call, so that the
    benchmark follows the core if reservation becomes several statements.
    With ``cfg.versions``, the other variants in turn with it, each
    repetition running every one once, starting with each in turn."""
    candidates = await settled_candidates(conn, cfg)
    in_flight = await conn.fetchval(
        "SELECT count(*) FROM deliveries WHERE state = 'sending' AND lease_expires_at > now()"
    )

    async def v7(ceiling: int | None = None) -> int:
        return len((await _reserve(conn, candidates, cfg.limit, cfg, ceiling)).deliveries)

    variants: dict[str, Callable[[], Awaitable[int]]] = {"reserve": v7}
    if cfg.versions:
        variants["ceiling_above"] = lambda: v7(in_flight + cfg.limit)
        variants["ceiling_held"] = lambda: v7(cfg.limit)
    times: dict[str, list[float]] = {name: [] for name in variants}
    reserved: dict[str, int] = {}
    names = list(variants)
    for rep in range(cfg.repeat + 1):
        # each variant first as often as the others: a round leaves the
        # versions it rolled back for the next to step over
        for name in names[rep % len(names) :] + names[: rep % len(names)]:
            run = variants[name]
            tx = conn.transaction()
            await tx.start()
            started = time.perf_counter()
            reserved[name] = await run()
            times[name].append(time.perf_counter() - started)
            await tx.rollback()
    timed = {name: spent[1:] for name, spent in times.items()}  # the first plans and warms the cache
    versions = {
        name: {
            "reserved": reserved[name],
            "median_ms": statistics.median(spent) * 1000,
            "min_ms": min(spent) * 1000,
            "over_reserve": statistics.median(spent) / statistics.median(timed["reserve"]),
        }
        for name, spent in timed.items()
        if name != "reserve"
    }
    return {
        "candidates": len(candidates),
        "reserved": reserved["reserve"],
        "median_ms": statistics.median(timed["reserve"]) * 1000,
        "min_ms": min(timed["reserve"]) * 1000,
        "max_ms": max(timed["reserve"]) * 1000,
        "versions": versions,
    }


async def explain(conn: asyncpg.Connection, cfg: Config) -> str:
    """The plans of every statement inside one reservation (``reserve`` is a
    function call, so EXPLAIN on it shows nothing): auto_explain, at NOTICE
    level so that the plans come back to this client."""
    candidates = await settled_candidates(conn, cfg)
    plans: list[str] = []
    conn.add_log_listener(lambda _conn, message: plans.append(message.message))
    tx = conn.transaction()
    await tx.start()
    try:
        await conn.execute(
            "LOAD 'auto_explain'; SET LOCAL auto_explain.log_min_duration = 0;"
            " SET LOCAL auto_explain.log_nested_statements = on; SET LOCAL auto_explain.log_analyze = on;"
            " SET LOCAL auto_explain.log_buffers = on; SET LOCAL auto_explain.log_level = notice;"
            " SET LOCAL client_min_messages = notice"
        )
        await _reserve(conn, candidates, cfg.limit, cfg)
    finally:
        await tx.rollback()
    return "\n\n".join(plans)


async def one_size(server: str, endpoints: int, cfg: Config, plan_dir: str | None) -> dict:
    async with fresh_database(server, "reservation") as dsn:
        conn = await asyncpg.connect(dsn)
        try:
            filled = await fill(conn, endpoints, cfg)
            timing = await time_reserve(conn, cfg)
            if plan_dir:
                suffix = f"-finished-{cfg.finished}" if cfg.finished else ""
                suffix += f"-rate-limited-{cfg.rate_limited}" if cfg.rate_limited else ""
                path = Path(plan_dir) / f"reserve-plan-{endpoints}{suffix}.txt"
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(await explain(conn, cfg) + "\n")
        finally:
            await conn.close()
    return {"endpoints": endpoints, **filled, **timing}


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.sizes:
        cfg = replace(cfg, sizes=tuple(args.sizes))
    if args.pending:
        cfg = replace(cfg, pending=args.pending)
    cfg = replace(cfg, versions=args.versions)
    # Each size as it is, with the finished rows, and rate-limited (beside them).
    variants = {
        "sizes": cfg,
        **({"with_finished": replace(cfg, finished=args.finished)} if args.finished else {}),
        **(
            {"rate_limited": replace(cfg, finished=args.finished or 0, rate_limited=args.rate_limited)}
            if args.rate_limited
            else {}
        ),
    }
    timed: dict[str, list[dict]] = {k: [] for k in ("sizes", "with_finished", "rate_limited")}
    with postgres_server(args.dsn) as server:
        for n in cfg.sizes:
            for kind, variant in variants.items():
                r = await one_size(server, n, variant, args.plan_dir)
                print(
                    f"{n:7d} endpoints, {variant.finished:9d} finished, rate limit {variant.rate_limited}/s: "
                    f"reserve median {r['median_ms']:.2f} ms "
                    f"(min {r['min_ms']:.2f}, max {r['max_ms']:.2f}), reserved {r['reserved']}",
                    flush=True,
                )
                for name, v in r["versions"].items():
                    print(
                        f"{'':7s} {name}: median {v['median_ms']:.2f} ms ({v['over_reserve']:.2f}x, "
                        f"min {v['min_ms']:.2f}), "
                        f"reserved {v['reserved']}",
                        flush=True,
                    )
                timed[kind].append(r)
    results, with_finished = timed["sizes"], timed["with_finished"]
    small, large = results[0], results[-1]
    ratio = large["median_ms"] / small["median_ms"]
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "sizes": results,
        "ratio_largest_over_smallest": ratio,
        "target_at_most_2x": ratio <= 2.0,
        "with_finished": with_finished,
        # empty without --finished: then nothing was timed with finished rows
        "finished_over_none": [
            f["median_ms"] / r["median_ms"] for r, f in zip(results, with_finished, strict=False)
        ],
        # empty without --rate-limited; beside the same rows unlimited
        "rate_limited": timed["rate_limited"],
        "rate_limited_over_unlimited": [
            limited["median_ms"] / r["median_ms"]
            for r, limited in zip(with_finished or results, timed["rate_limited"], strict=False)
        ],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="cost of the reserve statement by endpoint count")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark databases on (default: LocalPostgres)"
    )
    parser.add_argument("--sizes", type=int, action="append", help="endpoint counts (repeatable)")
    parser.add_argument("--pending", type=int, help="pending deliveries in all, overriding the preset")
    parser.add_argument(
        "--finished", type=int, help="also time each size with this many delivered deliveries present"
    )
    parser.add_argument(
        "--rate-limited",
        type=int,
        help="also time each size with every endpoint rate-limited at this many starts a second",
    )
    parser.add_argument(
        "--versions",
        action="store_true",
        help="also time the previous version's function and reserve with tenant ceilings, in turn",
    )
    parser.add_argument("--plan-dir", help="write EXPLAIN ANALYZE of reserve per size here")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

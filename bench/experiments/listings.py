"""Listings at 10,000 endpoints: the admin API's endpoint list, the
dashboard's endpoints page and ``hooklane status``, timed end to end.

A database gets ``--endpoints`` endpoints (``--tenants`` tenants, a few
paused, deactivated or with an open circuit) and ``--deliveries``
deliveries by bulk INSERT, most delivered, ``--pending`` pending spread
over a fifth of the endpoints, some dead and in flight; then ANALYZE, as
autovacuum would leave it. Then a ``hooklane api`` of each tree answers
``GET /v1/admin/endpoints`` and ``GET /dashboard`` ``--runs`` times each
(real HTTP, the admin token), and ``hooklane status`` runs as a process:
time (p50, max) and bytes of each answer. The EXPLAIN ANALYZE of the
endpoint page statement, when the tree has it, shows which indexes it used.

``--before DIR`` runs the same against another tree too (e.g. ``git archive
b6e5578 | tar -x -C /tmp/before``), on the same database: its statements
need nothing this tree's migrations lack.

Run: ``python -m bench.experiments.listings --preset full --before /tmp/before``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import time
import urllib.request
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import asyncpg

from bench.common import (
    REPO,
    SECRET,
    fresh_database,
    machine,
    postgres_server,
    python_module,
    run_and_report,
    stop_process,
    summary,
)
from hooklane.dev.postgres import free_port

TOKEN = "bench-listings-admin-token-0123456789"


@dataclass(frozen=True)
class Config:
    endpoints: int
    tenants: int
    deliveries: int
    pending: int
    runs: int


PRESETS = {
    "smoke": Config(endpoints=300, tenants=10, deliveries=6_000, pending=300, runs=2),
    "full": Config(endpoints=10_000, tenants=100, deliveries=1_000_000, pending=50_000, runs=10),
}


async def populate(dsn: str, cfg: Config) -> None:
    """Endpoints, events and deliveries by bulk INSERT, then ANALYZE."""
    conn = await asyncpg.connect(dsn)
    try:
        await conn.execute(
            """
            INSERT INTO endpoints (namespace, name, tenant, url, secret, partition, paused,
                                   state, consecutive_failures, paused_until)
            SELECT 'ns-' || (i % 20), 'ep-' || i, 't' || (i % $2), 'https://receiver.example/' || i, $3,
                   (hashtext('ns-' || (i % 20) || '/ep-' || i)::bigint & 2147483647)
                     % (SELECT partition_count FROM hooklane_config),
                   i % 97 = 0,
                   CASE WHEN i % 89 = 0 THEN 'deactivated' ELSE 'active' END,
                   CASE WHEN i % 83 = 0 THEN 5 ELSE 0 END,
                   CASE WHEN i % 83 = 0 THEN now() + interval '1 minute' END
            FROM generate_series(0, $1 - 1) AS i
            """,
            cfg.endpoints,
            cfg.tenants,
            SECRET,
        )
        # One event per tenant and delivery slot: deliveries per endpoint
        # equal, each from a distinct event of the endpoint's tenant.
        per_endpoint = max(1, cfg.deliveries // cfg.endpoints)
        await conn.execute(
            """
            INSERT INTO events (id, tenant, type, data, fanout, created_at)
            SELECT 'ev-' || n, 't' || t, 'order.created', '{}', $1 / $2,
                   now() - make_interval(secs => 3600.0 * n / $3)
            FROM generate_series(0, $2 - 1) AS t, generate_series(0, $3 - 1) AS n
            """,
            cfg.endpoints,
            cfg.tenants,
            per_endpoint,
        )
        # The newest deliveries of a fifth of the endpoints are pending (the
        # backlog of slow receivers), a few in flight, a few older ones dead.
        pending_per = max(1, cfg.pending // max(1, cfg.endpoints // 5))
        await conn.execute(
            """
            INSERT INTO deliveries (endpoint_id, event_tenant, event_id, state, attempts,
                                    attempted_by, created_at, next_attempt_at, delivered_at)
            SELECT ep.id, ep.tenant, 'ev-' || n,
                   CASE WHEN ep.id % 5 = 0 AND n >= $1 - $2 THEN 'pending'
                        WHEN ep.id % 50 = 1 AND n = $1 - 1 THEN 'sending'
                        WHEN ep.id % 10 = 3 AND n < 3 THEN 'dead'
                        ELSE 'delivered' END,
                   1, 'worker-' || (ep.id % 3),
                   now() - make_interval(secs => 3600.0 * ($1 - n) / $1 + ep.id % 600),
                   now() + make_interval(secs => ep.id % 60),
                   now() - make_interval(secs => 3600.0 * ($1 - n) / $1)
            FROM endpoints ep, generate_series(0, $1 - 1) AS n
            """,
            per_endpoint,
            pending_per,
        )
        await conn.execute("VACUUM ANALYZE endpoints")
        await conn.execute("VACUUM ANALYZE events")
        await conn.execute("VACUUM ANALYZE deliveries")
    finally:
        await conn.close()


def _get(url: str, headers: dict[str, str]) -> tuple[float, int]:
    started = time.perf_counter()
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers), timeout=120) as answer:
        size = len(answer.read())
    return time.perf_counter() - started, size


def _wait_up(port: int, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            _get(f"http://127.0.0.1:{port}/healthz", {})
            return
        except OSError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def _timed(name: str, seconds: list[float], sizes: list[int]) -> dict[str, object]:
    return {"what": name, "seconds": summary(seconds), "bytes": max(sizes)}


def measure_tree(dsn: str, cfg: Config, tree: Path | None) -> list[dict[str, object]]:
    env = {
        **os.environ,
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_ADMIN_TOKENS": TOKEN,
        "HOOKLANE_API_TOKENS": TOKEN + "-ingest",
        "HOOKLANE_METRICS_PORT": "0",
    }
    port = free_port()
    env["HOOKLANE_API_PORT"] = str(port)
    api = subprocess.Popen(
        python_module("hooklane.cli", "--log-level", "WARNING", "api", tree=tree), env=env, cwd=REPO
    )
    results = []
    try:
        _wait_up(port)
        for name, path, headers in (
            ("admin GET /v1/admin/endpoints", "/v1/admin/endpoints", {"Authorization": f"Bearer {TOKEN}"}),
            ("dashboard GET /dashboard", "/dashboard", {"Cookie": f"hooklane_admin={TOKEN}"}),
        ):
            seconds, sizes = [], []
            for _ in range(cfg.runs):
                took, size = _get(f"http://127.0.0.1:{port}{path}", headers)
                seconds.append(took)
                sizes.append(size)
            results.append(_timed(name, seconds, sizes))
    finally:
        stop_process(api)
    seconds, sizes = [], []
    for _ in range(cfg.runs):
        started = time.perf_counter()
        done = subprocess.run(
            python_module("hooklane.cli", "status", tree=tree),
            env=env,
            cwd=REPO,
            capture_output=True,
            check=True,
        )
        seconds.append(time.perf_counter() - started)
        sizes.append(len(done.stdout))
    results.append(_timed("hooklane status (process, Python start included)", seconds, sizes))
    return results


async def explain_page(dsn: str, tree: Path) -> list[str] | None:
    """EXPLAIN ANALYZE of the tree's endpoint_page statement, first page."""
    from hooklane.store.queries import load

    queries = load((tree / "hooklane/store/queries.sql").read_text())
    if "endpoint_page" not in queries:
        return None
    page = queries["endpoint_page"]
    conn = await asyncpg.connect(dsn)
    try:
        rows = await conn.fetch(
            "EXPLAIN (ANALYZE, BUFFERS) " + page.sql,
            *page.args(
                tenant=None,
                name_prefix=None,
                phase=None,
                not_delivering=False,
                cursor_oldest_pending_at=None,
                cursor_namespace=None,
                cursor_name=None,
                limit=101,
            ),
        )
    finally:
        await conn.close()
    return [r[0] for r in rows]


async def measure_status_pass(dsn: str, runs: int) -> list[dict[str, object]]:
    """The operator's status pass statement (this tree's), on its first
    pass (no digest known: every endpoint is returned) and when idle (every
    digest known: nothing is)."""
    from hooklane import store

    conn = await asyncpg.connect(dsn)
    try:
        results = []
        for label, known in (("first", False), ("idle", True)):
            digests: dict[int, str] = {}
            if known:
                first = await store.endpoint_health_changed(conn, {}, 10.0)
                digests = {health.id: digest for health, digest in first.health}
            seconds, sizes = [], []
            for _ in range(runs):
                started = time.perf_counter()
                changed = await store.endpoint_health_changed(conn, digests, 10.0)
                seconds.append(time.perf_counter() - started)
                sizes.append(len(changed.health))
            results.append(
                {"what": f"operator status pass, {label}", "seconds": summary(seconds), "rows": max(sizes)}
            )
        return results
    finally:
        await conn.close()


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    cfg = replace(
        cfg, **{k: v for k in ("endpoints", "deliveries", "runs") if (v := getattr(args, k)) is not None}
    )
    trees: dict[str, Path | None] = {"this tree": None}
    if args.before:
        trees = {"before": Path(args.before), **trees}
    result: dict = {"config": asdict(cfg), "machine": machine(), "runs": {}}
    with postgres_server(args.dsn) as server:
        async with fresh_database(server, "listings") as dsn:
            started = time.perf_counter()
            await populate(dsn, cfg)
            result["populate_seconds"] = time.perf_counter() - started
            for label, tree in trees.items():
                result["runs"][label] = await asyncio.to_thread(measure_tree, dsn, cfg, tree)
            result["plan"] = await explain_page(dsn, REPO)
            result["status_pass"] = await measure_status_pass(dsn, cfg.runs)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=PRESETS, default="smoke")
    parser.add_argument("--dsn", help="a server to create the database on (default: a throwaway one)")
    parser.add_argument("--before", help="another source tree to measure as well, on the same database")
    parser.add_argument("--endpoints", type=int)
    parser.add_argument("--deliveries", type=int)
    parser.add_argument("--runs", type=int)
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(main_async, args)


if __name__ == "__main__":
    main()

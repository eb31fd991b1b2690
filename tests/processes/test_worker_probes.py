"""The worker's probe endpoints, as Kubernetes calls them: live while the
process answers, ready only when connected with its share of partitions, not
ready again while draining."""

from __future__ import annotations

import asyncio
import signal
import urllib.error
import urllib.request
from typing import IO

import asyncpg

import hooklane
from hooklane import store
from hooklane.dev.postgres import free_port
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer


async def _get(port: int, path: str) -> int:
    def call() -> int:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as response:
                return response.status
        except urllib.error.HTTPError as exc:
            return exc.code
        except OSError:
            return 0  # not listening yet

    return await asyncio.get_running_loop().run_in_executor(None, call)


def _probed_worker(dsn: str, port: int, stderr: IO[str] | None = None):
    return worker_process(dsn, stderr, HOOKLANE_METRICS_PORT=str(port), HOOKLANE_METRICS_HOST="127.0.0.1")


async def test_a_worker_is_live_at_once_and_ready_only_on_a_migrated_schema(db, dsn, tmp_path):
    # A database of its own, left unmigrated: the state of a fresh install
    # before the migration Job has run.
    await db.execute("CREATE DATABASE probes_unmigrated")
    empty = dsn.rsplit("/", 1)[0] + "/probes_unmigrated"
    port = free_port()
    log = tmp_path / "worker.log"
    with log.open("w") as stderr:
        worker = _probed_worker(empty, port, stderr)
    try:
        await wait_for(lambda: _get(port, "/healthz"), timeout=20)
        assert await _get(port, "/healthz") == 200
        # It found the database without the schema, and waits for it.
        await wait_for(lambda: "waiting for the database schema" in log.read_text(), timeout=20)
        assert await _get(port, "/readyz") == 503
        conn = await asyncpg.connect(empty)
        try:
            await store.migrate(conn)
        finally:
            await conn.close()
        await wait_for(lambda: _is(200, _get(port, "/readyz")), timeout=30)
    finally:
        worker.kill()
        worker.wait(timeout=10)
        await db.execute("DROP DATABASE probes_unmigrated WITH (FORCE)")


async def test_two_workers_are_both_ready_and_own_every_partition_between_them(db, dsn):
    ports = [free_port(), free_port()]
    workers = [_probed_worker(dsn, p) for p in ports]
    try:
        for port in ports:
            await wait_for(lambda port=port: _is(200, _get(port, "/readyz")), timeout=30)
        # A worker that joins while the first holds everything is ready with
        # nothing to take; the partitions change hands at the next rebalance.
        total = await db.fetchval("SELECT partition_count FROM hooklane_config")
        await wait_for(lambda: _owned_is(db, total), timeout=10)
        for port in ports:
            assert await _get(port, "/readyz") == 200
    finally:
        for w in workers:
            w.kill()
            w.wait(timeout=10)


async def _owned_is(db, total: int) -> bool:
    owned = await db.fetch(
        "SELECT pid, count(*) AS n FROM pg_locks WHERE locktype = 'advisory' AND classid = $1::int::oid"
        " AND objsubid = 2 AND granted GROUP BY pid",
        0x686C70,
    )
    return len(owned) == 2 and sum(r["n"] for r in owned) == total


async def test_a_draining_worker_is_live_but_not_ready(db, dsn, receiver):
    await add_endpoint(db, "slow", receiver.on("slow", Answer(204, delay=4.0)))
    port = free_port()
    worker = _probed_worker(dsn, port)
    try:
        await wait_for(lambda: _is(200, _get(port, "/readyz")), timeout=30)
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        await wait_for(lambda: db.fetchval("SELECT count(*) = 1 FROM deliveries WHERE state = 'sending'"))
        worker.send_signal(signal.SIGTERM)
        await wait_for(lambda: _is(503, _get(port, "/readyz")), timeout=5)
        assert await _get(port, "/healthz") == 200
        assert worker.poll() is None  # still draining the slow delivery
        code = await asyncio.get_running_loop().run_in_executor(None, worker.wait, 20)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(timeout=10)
    assert code == 0
    assert await db.fetchval("SELECT state FROM deliveries") == "delivered"


async def _is(expected: int, status) -> bool:
    return await status == expected

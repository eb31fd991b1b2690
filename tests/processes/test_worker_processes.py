"""``hooklane worker`` as real processes: sharing partitions, exact limits,
dying, draining and memory."""

from __future__ import annotations

import asyncio
import signal
import urllib.request

import psutil

import hooklane
from hooklane import store
from hooklane.dev.postgres import LocalPostgres, free_port
from hooklane.errors import StoreError
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer

PARTITION_CLASS = 0x686C70


async def _partitions_by_worker(db) -> dict[int, int]:
    """OS pid of each worker -> partitions it holds, from pg_locks."""
    rows = await db.fetch(
        """SELECT a.application_name, count(*) AS n
           FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE l.locktype = 'advisory' AND l.classid = $1::int::oid AND l.objsubid = 2 AND l.granted
           GROUP BY a.application_name""",
        PARTITION_CLASS,
    )
    return {int(r["application_name"].split(":")[1]): r["n"] for r in rows}


def _stop(*procs) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_three_workers_share_partitions_and_keep_limits_exact(db, dsn, receiver):
    limits = {f"ep{i}": 1 + i % 3 for i in range(12)}
    for name, limit in limits.items():
        await add_endpoint(db, name, receiver.on(name, Answer(204, delay=0.15)), max_concurrency=limit)
    for i in range(15):
        await hooklane.publish(db, tenant="acme", type="order.created", data={"i": i})
    workers = [worker_process(dsn) for _ in range(3)]
    try:
        # the wait is the check: 32 partitions shared 11, 11 and 10
        await wait_for(lambda: _balanced(_partitions_by_worker(db), {w.pid for w in workers}), timeout=20)
        await wait_for(
            lambda: db.fetchval("SELECT count(*) = 0 FROM deliveries WHERE state <> 'delivered'"), timeout=60
        )
    finally:
        _stop(*workers)
    for name, limit in limits.items():
        assert len(receiver.at(name)) == 15
        assert receiver.peak[f"/{name}"] == limit, (name, receiver.peak[f"/{name}"], limit)


async def _balanced(shares_coro, pids):
    shares = await shares_coro
    return (
        shares if set(shares) == pids and sum(shares.values()) == 32 and max(shares.values()) <= 11 else None
    )


async def test_a_killed_worker_loses_nothing_and_its_partitions_move(db, dsn, receiver):
    # One endpoint per partition, so that each worker's share holds some.
    names = await _one_endpoint_name_per_partition(db)
    for name in names:
        await add_endpoint(db, name, receiver.on(name, Answer(204)), timeout_seconds=10)
    victim = worker_process(dsn, HOOKLANE_WORKER_ID="victim")
    survivor = worker_process(dsn, HOOKLANE_WORKER_ID="survivor")
    try:
        await wait_for(lambda: _split_evenly(db, victim.pid, survivor.pid), timeout=20)
        # The victim's endpoints never answer it, so that it dies holding
        # every one of their deliveries; the survivor's answer at once.
        theirs = await db.fetch(
            """SELECT e.name, e.id FROM endpoints e
               JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid = $1::int::oid
                    AND l.objid = e.partition::oid AND l.objsubid = 2 AND l.granted
               JOIN pg_stat_activity a ON a.pid = l.pid
               WHERE a.application_name = $2""",
            PARTITION_CLASS,
            f"hooklane-worker:{victim.pid}",
        )
        assert len(theirs) == 16
        for r in theirs:
            receiver.on(r["name"], Answer(hang=True))
        events = [
            await hooklane.publish(db, tenant="acme", type="order.created", data={"i": i}) for i in range(4)
        ]
        hung = {r["name"] for r in theirs}

        async def victim_calls_arrived() -> bool:
            # 'sending' is written when a delivery is reserved, before its
            # call goes out: the victim dies once its calls have reached
            # the receivers too, which then expect each event twice.
            reserved = await db.fetchval(
                """SELECT count(*) FILTER (WHERE state = 'sending' AND attempted_by = 'victim') = 64
                          AND count(*) FILTER (WHERE state = 'delivered' AND attempted_by = 'survivor') = 64
                   FROM deliveries"""
            )
            return bool(reserved) and sum(len(receiver.at(name)) for name in hung) == 64

        await wait_for(victim_calls_arrived, timeout=20)
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        held = {
            r["id"]
            for r in await db.fetch(
                "SELECT id FROM deliveries WHERE state = 'sending' AND attempted_by = 'victim'"
            )
        }
        their_ids = [r["id"] for r in theirs]
        assert held == {
            r["id"]
            for r in await db.fetch("SELECT id FROM deliveries WHERE endpoint_id = ANY($1)", their_ids)
        }
        for r in theirs:
            receiver.on(r["name"], Answer(204))
        shares = await wait_for(lambda: _owns_all(db, survivor.pid), timeout=10)
        assert shares == {survivor.pid: 32}
        await wait_for(
            lambda: db.fetchval("SELECT count(*) = 0 FROM deliveries WHERE state <> 'delivered'"), timeout=60
        )
    finally:
        _stop(victim, survivor)
    # Exactly what the victim held was rescued, and the survivor delivered it.
    rows = await db.fetch("SELECT id, attempts, attempted_by FROM deliveries")
    assert {r["id"] for r in rows if r["attempts"] > 1} == held
    assert all(r["attempts"] == (2 if r["id"] in held else 1) for r in rows)
    assert {r["attempted_by"] for r in rows} == {"survivor"}
    for name in names:
        got = [r.headers["webhook-id"] for r in receiver.at(name)]
        # the victim's endpoints got each event twice: from the victim, unanswered, then from the survivor
        assert sorted(got) == sorted(events * (2 if name in hung else 1)), name


async def _one_endpoint_name_per_partition(db) -> list[str]:
    """The first endpoint name (default/epN) hashing to each partition."""
    return await db.fetchval(
        """SELECT array_agg(name ORDER BY p)
           FROM (SELECT DISTINCT ON (p) name, p
                 FROM generate_series(0, 9999) i,
                      LATERAL (SELECT 'ep' || i AS name) n,
                      LATERAL (SELECT (hashtext('default/' || n.name)::bigint & 2147483647)
                                      % (SELECT partition_count FROM hooklane_config) AS p) h
                 ORDER BY p, i) first"""
    )


async def _split_evenly(db, a, b):
    shares = await _partitions_by_worker(db)
    return shares == {a: 16, b: 16}


async def _owns_all(db, pid):
    shares = await _partitions_by_worker(db)
    return shares if shares.get(pid) == 32 else None


async def test_sigterm_drains_in_flight_deliveries_then_exits(db, dsn, receiver):
    await add_endpoint(db, "slow", receiver.on("slow", Answer(204, delay=1.5)))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    worker = worker_process(dsn)
    try:
        await wait_for(lambda: receiver.at("slow"), timeout=20)
        worker.send_signal(signal.SIGTERM)
        await hooklane.publish(db, tenant="acme", type="order.created", data={})
        code = await asyncio.get_running_loop().run_in_executor(None, worker.wait, 20)
    finally:
        _stop(worker)
    assert code == 0
    states = [r["state"] for r in await db.fetch("SELECT state FROM deliveries ORDER BY id")]
    assert states == ["delivered", "pending"]  # finished and recorded; nothing new taken
    assert len(receiver.at("slow")) == 1


async def test_huge_responses_do_not_grow_the_worker(db, dsn, receiver):
    await add_endpoint(db, "small", receiver.on("small", Answer(204)))
    await add_endpoint(
        db, "huge", receiver.on("huge", Answer(200, body_bytes=10 * 1024 * 1024)), tenant="big"
    )
    port = free_port()
    worker = worker_process(dsn, HOOKLANE_METRICS_PORT=str(port), HOOKLANE_METRICS_HOST="127.0.0.1")
    try:
        for _ in range(20):
            await hooklane.publish(db, tenant="acme", type="warm.up", data={})
        await wait_for(
            lambda: db.fetchval("SELECT count(*) = 20 FROM deliveries WHERE state = 'delivered'"), timeout=20
        )
        before = psutil.Process(worker.pid).memory_info().rss
        for _ in range(30):
            await hooklane.publish(db, tenant="big", type="report.ready", data={})
        await wait_for(
            lambda: db.fetchval("SELECT count(*) = 50 FROM deliveries WHERE state = 'delivered'"), timeout=60
        )
        grown = psutil.Process(worker.pid).memory_info().rss - before
        exposition = await asyncio.get_running_loop().run_in_executor(
            None,
            lambda: urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode(),
        )
    finally:
        _stop(worker)
    # 30 x 10 MB answered; the worker read none of it
    assert grown < 10 * 1024 * 1024, f"worker grew by {grown / 2**20:.1f} MiB"
    assert 'hooklane_deliveries_total{outcome="delivered"} 50.0' in exposition
    assert "hooklane_reservation_duration_seconds_bucket" in exposition


async def test_the_worker_survives_a_postgres_restart(receiver):
    with LocalPostgres() as pg:
        conn = await store.connect(pg.dsn)
        await store.migrate(conn)
        await add_endpoint(conn, "a", receiver.on("a", Answer(204)))
        await hooklane.publish(conn, tenant="acme", type="t", data={"n": 1})
        worker = worker_process(pg.dsn)
        try:
            await wait_for(lambda: len(receiver.at("a")) == 1, timeout=20)
            await conn.close()
            await asyncio.get_running_loop().run_in_executor(None, pg.restart)
            conn = await store.connect(pg.dsn)
            await hooklane.publish(conn, tenant="acme", type="t", data={"n": 2})
            await wait_for(lambda: len(receiver.at("a")) == 2, timeout=30)
            await wait_for(
                lambda: conn.fetchval("SELECT count(*) = 2 FROM deliveries WHERE state = 'delivered'"),
                timeout=30,
            )
            assert worker.poll() is None
        finally:
            _stop(worker)
            await conn.close()


async def test_the_worker_survives_its_connections_being_terminated(db, dsn, receiver):
    await add_endpoint(db, "a", receiver.on("a", Answer(204, delay=0.2)), max_concurrency=8)
    worker = worker_process(dsn)
    try:
        for i in range(20):
            await hooklane.publish(db, tenant="acme", type="t", data={"i": i})
        await wait_for(lambda: len(receiver.at("a")) >= 3, timeout=20)
        # what a failover or an administrator does to running statements
        killed = await db.fetchval(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        assert killed >= 2
        for i in range(20, 30):
            await hooklane.publish(db, tenant="acme", type="t", data={"i": i})
        await wait_for(
            lambda: db.fetchval("SELECT count(*) = 30 FROM deliveries WHERE state = 'delivered'"), timeout=60
        )
        assert worker.poll() is None
    finally:
        _stop(worker)


async def _publish_steadily(dsn: str, published: list[int], stop: asyncio.Event) -> None:
    """Publish one event every few milliseconds through restarts; an event
    counts once its transaction committed."""
    while not stop.is_set():
        try:
            conn = await store.connect(dsn, timeout=2)
        except StoreError:
            await asyncio.sleep(0.1)
            continue
        try:
            while not stop.is_set():
                n = len(published)
                await hooklane.publish(conn, tenant="acme", type="t", data={"n": n}, id=f"evt-{n}")
                published.append(n)
                await asyncio.sleep(0.01)
        except StoreError:
            await asyncio.sleep(0.1)
        finally:
            conn.terminate()


async def test_the_worker_rides_through_repeated_postgres_restarts_under_load(receiver):
    # Durable: an immediate shutdown is a crash, and only flushed commits
    # survive it; the test counts what was committed.
    with LocalPostgres(durable=True) as pg:
        conn = await store.connect(pg.dsn)
        await store.migrate(conn)
        for name in ("a", "b", "c"):
            await add_endpoint(conn, name, receiver.on(name, Answer(204, delay=0.01)), max_concurrency=2)
        await conn.close()
        worker = worker_process(pg.dsn)
        published: list[int] = []
        stop = asyncio.Event()
        publisher = asyncio.create_task(_publish_steadily(pg.dsn, published, stop))
        loop = asyncio.get_running_loop()

        def received() -> int:
            return sum(len(receiver.at(name)) for name in ("a", "b", "c"))

        try:
            for mode in ["fast", "immediate"] * 3:
                # Under load: deliveries flow again before each restart.
                before = received()
                await wait_for(lambda before=before: received() >= before + 10, timeout=30)
                await loop.run_in_executor(None, pg.restart, mode)
                assert worker.poll() is None, f"worker exited ({worker.returncode}) after a {mode} restart"
            stop.set()
            await publisher
            expected = {f"evt-{n}" for n in published}
            for name in ("a", "b", "c"):
                await wait_for(
                    lambda name=name: expected <= {r.headers["webhook-id"] for r in receiver.at(name)},
                    timeout=60,
                )
                assert receiver.peak["/" + name] <= 2
            assert worker.poll() is None
        finally:
            _stop(worker)
            stop.set()
            await publisher


async def test_a_worker_started_before_its_database_waits_for_it(receiver, tmp_path):
    port = free_port()
    log = tmp_path / "worker.log"

    def tried(what: str) -> bool:
        # The delivery at the end proves it went on waiting after each.
        return what in log.read_text()

    with log.open("w") as stderr:
        worker = worker_process(f"postgresql://postgres@127.0.0.1:{port}/postgres", stderr)
    try:
        await wait_for(lambda: tried("waiting for the database: "), timeout=30)
        assert worker.poll() is None, "the worker gave up on an unreachable database"
        with LocalPostgres(port=port) as pg:
            conn = await store.connect(pg.dsn)
            try:
                # reachable, not migrated: still waiting
                await wait_for(lambda: tried("waiting for the database schema"), timeout=30)
                assert worker.poll() is None, "the worker gave up on an unmigrated database"
                await store.migrate(conn)
                await add_endpoint(conn, "a", receiver.on("a", Answer(204)))
                await hooklane.publish(conn, tenant="acme", type="t", data={})
                await wait_for(lambda: len(receiver.at("a")) == 1, timeout=30)
            finally:
                await conn.close()
    finally:
        _stop(worker)

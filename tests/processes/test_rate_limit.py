"""spec.delivery's rate limit held across worker processes, one of them
killed, against real receivers; the other endpoints are spared."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import statistics
import subprocess
import time

import hooklane
from hooklane import store
from hooklane.delivery import DeliverySpec
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.rate_limit import busiest_second, grants_between, log_grants
from testsupport.receivers import Answer, Receiver

PARTITION_CLASS = 0x686C70

# The workers' slots, so that the limited endpoints' pace is their
# buckets' and not the machine's. A call still unanswered after
# long_call_seconds makes its endpoint slow, and a slow endpoint gets one
# delivery a round (issue 39): on two shared cores under load the calls
# to this process's receiver took up to 1.2 s, and "hundred" fell to 29
# starts a second. Past the calls' deadline (timeoutSeconds 2) no call
# goes long. And one endpoint holds a quarter of the quick slots at most
# (slots.QUICK_SHARE), its starts granted ahead included: 64 of the
# default 256 are a 100/s endpoint's second of lookahead with nothing to
# spare once its calls slow down; 1,024 leave it its maxConcurrency.
# Both are tested on their own (tests/unit/test_slots.py,
# tests/db/test_slow_receivers.py).
SLOTS = {"HOOKLANE_LONG_CALL_SECONDS": "10", "HOOKLANE_WORKER_CONCURRENCY": "1024"}


async def _same_partition_name(db, prefix: str, endpoint_id: int) -> str:
    """A name (``prefix``-N) whose endpoint would share the partition of
    ``endpoint_id``: the partitions' rule of upsert_endpoint."""
    return await db.fetchval(
        """SELECT n.name
           FROM generate_series(0, 9999) i, LATERAL (SELECT $1 || '-' || i AS name) n
           WHERE (hashtext('default/' || n.name)::bigint & 2147483647)
                 % (SELECT partition_count FROM hooklane_config)
                 = (SELECT partition FROM endpoints WHERE id = $2)
           ORDER BY i LIMIT 1""",
        prefix,
        endpoint_id,
    )


async def _owner(db, endpoint_id: int, workers: list[subprocess.Popen]) -> subprocess.Popen | None:
    """The worker process holding the endpoint's partition lock."""
    name = await db.fetchval(
        """SELECT a.application_name FROM endpoints e
           JOIN pg_locks l ON l.locktype = 'advisory' AND l.classid = $1::int::oid
                AND l.objid = e.partition::oid AND l.objsubid = 2 AND l.granted
           JOIN pg_stat_activity a ON a.pid = l.pid
           WHERE e.id = $2""",
        PARTITION_CLASS,
        endpoint_id,
    )
    pid = None if name is None else int(name.split(":")[1])
    return next((w for w in workers if w.pid == pid), None)


async def _all_partitions_held(db) -> bool:
    held = await db.fetchval(
        """SELECT count(DISTINCT l.objid) FROM pg_locks l
           WHERE l.locktype = 'advisory' AND l.classid = $1::int::oid AND l.objsubid = 2 AND l.granted""",
        PARTITION_CLASS,
    )
    return held == 32


async def _until(moment: float, workers: list[subprocess.Popen]) -> None:
    """Wait until the clock passes ``moment`` (the end of a measured
    stretch), failing at once should a worker exit meanwhile."""

    def passed() -> bool:
        assert all(w.poll() is None for w in workers), "a worker exited"
        return time.time() >= moment

    await wait_for(passed, timeout=moment - time.time() + 30, interval=0.2)


class Trickle:
    """One event of tenant acme every ``every`` seconds, on a connection
    of its own, noting when each was published."""

    def __init__(self, dsn: str, every: float) -> None:
        self.dsn, self.every = dsn, every
        self.published: dict[str, float] = {}
        self.stopping = asyncio.Event()

    async def run(self) -> None:
        conn = await store.connect(self.dsn)
        try:
            while not self.stopping.is_set():
                at = time.time()
                event_id = await hooklane.publish(conn, tenant="acme", type="order.created", data={})
                self.published[event_id] = at
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.stopping.wait(), self.every)
        finally:
            await conn.close()


def _lags(receiver: Receiver, paths: list[str], published: dict[str, float], since: float, until: float):
    """Publish-to-arrival of each event published in [since, until) at
    each of ``paths`` (its first arrival); missing ones count as never."""
    lags = []
    for path in paths:
        first: dict[str, float] = {}
        for r in receiver.at(path):
            first.setdefault(r.headers["webhook-id"], r.at)
        for event_id, at in published.items():
            if since <= at < until:
                lags.append(first.get(event_id, float("inf")) - at)
    return sorted(lags)


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


async def test_rate_limits_hold_across_workers_one_killed_and_spare_the_others(db, dsn, receiver, tmp_path):
    window = 60.0
    limits = {"hundred": 100, "ten": 10}
    # The slots a limited endpoint needs are its starts granted ahead (a
    # second's worth: RATE_LOOKAHEAD_SECONDS) and those being answered and
    # recorded. The killed worker's granted starts hold their slots until
    # their leases end (timeoutSeconds + the lease's grace): room for a
    # second's worth more keeps the survivors at the rate meanwhile.
    hundred = await add_endpoint(
        db,
        "hundred",
        receiver.on("hundred", Answer(204)),
        tenant="hundred",
        max_concurrency=256,
        timeout_seconds=2,
        delivery=DeliverySpec(rate_per_second=100),
    )
    # Both limited endpoints in one partition, so that the worker killed
    # holds both.
    ten_name = await _same_partition_name(db, "ten", hundred)
    ten = await add_endpoint(
        db,
        ten_name,
        receiver.on("ten", Answer(204)),
        tenant="ten",
        max_concurrency=32,
        timeout_seconds=2,
        delivery=DeliverySpec(rate_per_second=10),
    )
    assert await db.fetchval("SELECT count(DISTINCT partition) FROM endpoints") == 1
    await log_grants(db)
    healthy = [f"healthy{i}" for i in range(4)]
    for name in healthy:
        await add_endpoint(db, name, receiver.on(name, Answer(204)))
    logs = [open(tmp_path / f"worker{i}.log", "w") for i in range(3)]  # noqa: SIM115
    workers = [
        worker_process(dsn, stderr=log, HOOKLANE_WORKER_ID=f"w{i}", **SLOTS) for i, log in enumerate(logs)
    ]
    trickle = Trickle(dsn, every=0.1)
    publishing = asyncio.create_task(trickle.run())
    try:
        await wait_for(lambda: _all_partitions_held(db), timeout=30)
        # The baseline: the healthy endpoints' lag before any backlog.
        baseline_from = time.time()
        await _until(baseline_from + 5, workers)
        baseline_to = time.time()
        # Over twice what the window takes at either rate: on a busy
        # machine the window, which waits for the first arrivals, started
        # late enough that 7,500 ran out before its end (5,307 in it).
        for tenant, n in (("hundred", 15_000), ("ten", 1_500)):
            for first in range(0, n, 1000):
                async with db.transaction():
                    await store.insert_events(
                        db,
                        [
                            store.Event(f"{tenant}-{i}", tenant, "bulk.item", "{}")
                            for i in range(first, min(n, first + 1000))
                        ],
                    )
        await wait_for(lambda: receiver.at("hundred") and receiver.at("ten"), timeout=30)
        # The buckets are full from here on: the window starts a second in.
        start = time.time() + 1
        await _until(start + window / 2, workers)
        victim = await wait_for(lambda: _owner(db, hundred, workers))
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=10)
        killed_at = time.time()
        survivors = [w for w in workers if w is not victim]
        await _until(start + window, survivors)
        end = time.time()
        pending = {
            name: await db.fetchval(
                "SELECT count(*) FROM deliveries WHERE endpoint_id = $1 AND state = 'pending'", ep
            )
            for name, ep in (("hundred", hundred), ("ten", ten))
        }
        trickle.stopping.set()
        await publishing
        # Every trickled event reached every healthy endpoint: the lags
        # below are all finite.
        await wait_for(
            lambda: all(
                {r.headers["webhook-id"] for r in receiver.at(name)} >= set(trickle.published)
                for name in healthy
            ),
            timeout=30,
        )
    finally:
        trickle.stopping.set()
        for w in workers:
            if w.poll() is None:
                w.kill()
            w.wait(timeout=10)
        for log in logs:
            log.close()
        with contextlib.suppress(Exception):
            await publishing

    print(f"window {start:.1f}..{end:.1f} ({end - start:.1f} s), worker killed at +{killed_at - start:.1f} s")
    for name, endpoint_id in (("hundred", hundred), ("ten", ten)):
        limit = limits[name]
        # The starts the bucket granted, whichever worker granted them, the
        # killed one's included: the limit's own count. The receiver's
        # arrivals are only printed: its clock is this process's, whose
        # loop also publishes and polls, and on two shared cores under load
        # its stalls stamped a second's arrivals with 136 where the workers
        # had started 105, and moved the window's edges.
        grants = await grants_between(db, endpoint_id, start, start + window)
        granted = len(grants)
        rate = granted / window
        at = [r.at for r in receiver.at(name) if start <= r.at < start + window]
        # The calls as their workers started them.
        started = await db.fetchval(
            "SELECT array_agg(extract(epoch FROM started_at)::float8) FROM delivery_attempts"
            " WHERE endpoint_id = $1 AND failure IS DISTINCT FROM 'lease_expired'"
            " AND started_at >= to_timestamp($2) AND started_at < to_timestamp($3)",
            endpoint_id,
            start,
            start + window,
        )
        busiest = busiest_second(started)
        # A start is never sooner than its grant (checked below) and the
        # grants are 1/rate apart, so a second's starts are at most the
        # grants of that second and of the latest start's lateness before
        # it. The worker holds late starts back to catch up at 1.25 times
        # the rate (rules.paced_start) but cannot when its own loop, starved
        # of CPU, wakes late: on two shared cores under load starts came
        # up to 460 ms late, 146 of them in a second at 100/s. Starts no
        # bucket granted (a second bucket, a burst at a takeover) exceed it.
        # The window's first starts may be those of grants made before it;
        # 2 ms: the millisecond a start may come before its grant (below)
        # and the grants' rounding to the microsecond.
        late = max(
            g["started"] - g["scheduled"]
            for g in await grants_between(db, endpoint_id, start - 2, start + window)
            if g["started"] is not None
        )
        bound = limit * (1 + late + 2e-3) + 1
        print(
            f"{name}: {granted} starts granted = {rate:.2f}/s (limit {limit}), {len(started)} started,"
            f" {len(at)} arrivals; busiest second {busiest} as started (bound {bound:.0f}: {late * 1000:.0f} ms"
            f" late at most), {busiest_second(at)} as received; {pending[name]} still pending"
        )
        # The backlog outlasted the window: the rate, not the queue, set
        # the pace. The bucket grants no faster than the rate (its spacing
        # is checked exactly below); it loses only the moments no round
        # took the endpoint's starts, as while a survivor took the killed
        # worker's partition over.
        assert pending[name] > 0
        assert limit * 0.95 <= rate <= limit + 1 / window, (name, rate)
        # Every start granted was made, but for a second's worth the
        # killed worker was granted ahead and never made
        # (RATE_LOOKAHEAD_SECONDS), and at most a second's more: its calls
        # in flight, whose results it never recorded, and the window's last
        # grants, started after its end.
        assert len(started) >= granted - 2 * limit, (name, len(started), granted)
        assert busiest <= bound, (name, busiest, bound)

    # What the buckets granted, exactly: each start a 1/rate after the one
    # before, whichever worker granted it, the killed one's included; and
    # no start sooner than granted.
    rounds: dict[str, float] = {}
    for name, endpoint_id in (("hundred", hundred), ("ten", ten)):
        grants = await grants_between(db, endpoint_id, start, start + window)
        scheduled = [g["scheduled"] for g in grants]
        spacing = min(b - a for a, b in itertools.pairwise(scheduled))
        lateness = sorted(g["started"] - g["scheduled"] for g in grants if g["started"] is not None)
        rounds[name] = len({g["reserved"] for g in grants}) / window
        print(
            f"{name}: {len(grants)} starts granted, closest {spacing * 1000:.3f} ms apart;"
            f" started late by p50 {statistics.median(lateness) * 1000:.0f} ms,"
            f" p99 {_quantile(lateness, 0.99) * 1000:.0f} ms, max {lateness[-1] * 1000:.0f} ms;"
            f" {rounds[name]:.1f} reservation rounds/s"
        )
        # make_interval rounds each grant to the microsecond.
        assert spacing >= 1 / limits[name] - 2e-6, (name, spacing)
        assert lateness[0] >= -1e-3, (name, lateness[0])
    # A round grants a second's starts ahead (RATE_LOOKAHEAD_SECONDS) and
    # the next comes half a second on; the results a worker records, at
    # most every 0.1 s (runner._RECORD_INTERVAL), may each bring one
    # sooner: some 12 a second, not one per start.
    assert rounds["hundred"] <= 2 * (2 + 10), rounds

    before = _lags(receiver, healthy, trickle.published, baseline_from, baseline_to)
    during = _lags(receiver, healthy, trickle.published, start, start + window)
    late = _lags(receiver, healthy, trickle.published, start + window - 10, start + window)
    for label, lags in (("before the backlog", before), ("during it", during), ("its last 10 s", late)):
        print(
            f"healthy lag {label}: n={len(lags)} p50 {statistics.median(lags) * 1000:.0f} ms,"
            f" p99 {_quantile(lags, 0.99) * 1000:.0f} ms, max {lags[-1] * 1000:.0f} ms"
        )
    # The limited endpoints' backlog is no queue of theirs: their lag
    # stays what it was before it, and short.
    assert _quantile(during, 0.99) < 1.0
    assert statistics.median(during) <= 2 * statistics.median(before) + 0.05
    assert statistics.median(late) <= 2 * statistics.median(before) + 0.05

"""spec.delivery's rate limit and adaptive concurrency, against real
receivers: the rate held across worker processes (one of them killed), a
burst, and a limit that follows the receiver's overload signals."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import signal
import statistics
import subprocess
import time

import pytest

import hooklane
from hooklane import store
from hooklane.delivery import DeliverySpec
from hooklane.policies import CircuitPolicy
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer, Receiver

PARTITION_CLASS = 0x686C70


async def _backlog(db, tenant: str, n: int, event_type: str = "bulk.item") -> None:
    """``n`` events of ``tenant`` published in one transaction."""
    async with db.transaction():
        await store.insert_events(
            db, [store.Event(f"{tenant}-{i}", tenant, event_type, f'{{"i": {i}}}') for i in range(n)]
        )


def _busiest_second(at: list[float]) -> int:
    """The most arrivals in any window [t, t + 1 s), sliding."""
    at = sorted(at)
    most, first = 0, 0
    for last, t in enumerate(at):
        while at[first] <= t - 1.0:
            first += 1
        most = max(most, last - first + 1)
    return most


def _second_bound(per_second: int) -> int:
    # The bucket's own schedule is checked exactly (_grants); starts add
    # the lateness of the worker's sleep (arrivals, that of this process's
    # receiver too), and a start held back by a stall lands in the next
    # second with that second's own. On two shared cores stalls of 50-100 ms come now and
    # then (a 100/s endpoint's busiest second was 103 to 106 over runs
    # here, 111 and 114 while a benchmark or the whole suite shared the
    # cores, and bench/rate_limit.py saw 1.25x at 500/s after a stall):
    # 30% is 300 ms of a worker's lateness at any rate, while a real fault
    # (a second bucket, a burst at a takeover) is a whole second's starts
    # more, which this still catches. At 10/s a start is 100 ms apart.
    return per_second + max(2, round(per_second * 0.30))


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


async def _log_grants(db) -> None:
    """Note every start a bucket grants as it is granted: complete clears
    a finished delivery's ``rate_tat`` once it has passed, and a rescued
    delivery is granted again, so the deliveries alone keep only some."""
    await db.execute(
        """CREATE TABLE test_grants (delivery_id bigint, endpoint_id bigint,
                                     rate_tat timestamptz, reserved_at timestamptz);
           CREATE FUNCTION test_log_grant() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               INSERT INTO test_grants VALUES (NEW.id, NEW.endpoint_id, NEW.rate_tat, NEW.reserved_at);
               RETURN NULL;
           END $$;
           CREATE TRIGGER test_log_grant AFTER UPDATE OF rate_tat ON deliveries FOR EACH ROW
               WHEN (NEW.rate_tat IS NOT NULL AND NEW.rate_tat IS DISTINCT FROM OLD.rate_tat)
               EXECUTE FUNCTION test_log_grant()"""
    )


async def _grants(db, endpoint_id: int, since: float, until: float) -> list:
    """The starts an endpoint's bucket granted from ``since`` to ``until``
    (epoch seconds), in order: when each was scheduled (its bucket after
    it, less the start: burst 1), the round that granted it, and when its
    delivered attempt started, for the delivery's last grant (None if it
    has not been delivered, or was granted again later)."""
    return await db.fetch(
        """SELECT g.scheduled, extract(epoch FROM l.reserved_at)::float8 AS reserved,
                  (SELECT extract(epoch FROM a.started_at)::float8 FROM delivery_attempts a
                   WHERE a.delivery_id = l.delivery_id AND a.outcome = 'delivered'
                     AND NOT EXISTS (SELECT 1 FROM test_grants n
                                     WHERE n.delivery_id = l.delivery_id AND n.rate_tat > l.rate_tat))
                  AS started
           FROM test_grants l
           JOIN endpoints e ON e.id = l.endpoint_id
           CROSS JOIN LATERAL (SELECT extract(epoch FROM l.rate_tat)::float8
                                      - 1.0 / e.rate_per_second AS scheduled) g
           WHERE l.endpoint_id = $1 AND g.scheduled >= $2 AND g.scheduled < $3
           ORDER BY g.scheduled""",
        endpoint_id,
        since,
        until,
    )


def _quantile(values: list[float], q: float) -> float:
    return values[min(len(values) - 1, int(q * len(values)))]


@pytest.mark.processes
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
    await _log_grants(db)
    healthy = [f"healthy{i}" for i in range(4)]
    for name in healthy:
        await add_endpoint(db, name, receiver.on(name, Answer(204)))
    logs = [open(tmp_path / f"worker{i}.log", "w") for i in range(3)]  # noqa: SIM115
    workers = [worker_process(dsn, stderr=log, HOOKLANE_WORKER_ID=f"w{i}") for i, log in enumerate(logs)]
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
        at = [r.at for r in receiver.at(name) if start <= r.at < start + window]
        rate = len(at) / window
        # The calls as their workers started them. The receiver's clock is
        # this process's, whose loop also publishes and polls: on two
        # shared cores under load its stalls stamped a second's arrivals
        # with 136 where the workers had started 105. The killed worker's
        # calls still in flight are not recorded: a few, around the kill.
        started = await db.fetchval(
            "SELECT array_agg(extract(epoch FROM started_at)::float8) FROM delivery_attempts"
            " WHERE endpoint_id = $1 AND failure IS DISTINCT FROM 'lease_expired'"
            " AND started_at >= to_timestamp($2) AND started_at < to_timestamp($3)",
            endpoint_id,
            start,
            start + window,
        )
        busiest = _busiest_second(started)
        print(
            f"{name}: {len(at)} arrivals = {rate:.2f}/s (limit {limit}), busiest second {busiest} as started"
            f" (bound {_second_bound(limit)}), {_busiest_second(at)} as received, {pending[name]} still pending"
        )
        # The backlog outlasted the window: the rate, not the queue, set
        # the pace.
        assert pending[name] > 0
        assert limit * 0.95 <= rate <= limit * 1.05, (name, rate)
        assert busiest <= _second_bound(limit), (name, busiest)

    # What the buckets granted, exactly: each start a 1/rate after the one
    # before, whichever worker granted it, the killed one's included; and
    # no start sooner than granted.
    rounds: dict[str, float] = {}
    for name, endpoint_id in (("hundred", hundred), ("ten", ten)):
        grants = await _grants(db, endpoint_id, start, start + window)
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


async def test_a_slow_reservation_does_not_make_the_starts_it_granted_late(db, receiver, start_worker):
    # Every round that reserves takes 0.4 s more, from its start (now(),
    # which its grants count from) to its answer: a start waited for from
    # the answer's arrival came that much late, into the next round's.
    await db.execute(
        """CREATE FUNCTION test_slow_round() RETURNS trigger LANGUAGE plpgsql AS $$
           BEGIN
               IF EXISTS (SELECT 1 FROM reserved WHERE state = 'sending') THEN
                   PERFORM pg_sleep(0.4);
               END IF;
               RETURN NULL;
           END $$;
           CREATE TRIGGER test_slow_round AFTER UPDATE ON deliveries
               REFERENCING NEW TABLE AS reserved FOR EACH STATEMENT EXECUTE FUNCTION test_slow_round()"""
    )
    await _log_grants(db)
    url = receiver.on("paced", Answer(204))
    paced = await add_endpoint(
        db, "paced", url, max_concurrency=32, delivery=DeliverySpec(rate_per_second=10)
    )
    await _backlog(db, "acme", 30)
    since = time.time()
    start_worker()
    await wait_for(lambda: len(receiver.at("paced")) >= 30, timeout=30)
    await wait_for(
        lambda: db.fetchval("SELECT count(*) = 30 FROM delivery_attempts WHERE outcome = 'delivered'"),
        timeout=10,
    )
    grants = await _grants(db, paced, since - 1, time.time())
    lateness = sorted(g["started"] - g["scheduled"] for g in grants if g["started"] is not None)
    print("started late by, ms:", [round(x * 1000) for x in lateness])
    assert len(lateness) == 30
    # Never sooner than granted; those granted for after their round's
    # answer on time, less the loop's own lateness; only those whose time
    # came while the round ran, at its answer.
    assert lateness[0] >= -1e-3
    assert statistics.median(lateness) < 0.2


async def test_a_burst_goes_at_once_then_the_rate_holds(db, receiver, start_worker):
    url = receiver.on("bursty", Answer(204))
    await add_endpoint(
        db, "bursty", url, max_concurrency=16, delivery=DeliverySpec(rate_per_second=5, burst=10)
    )
    start_worker()
    await _backlog(db, "acme", 40)
    await wait_for(lambda: len(receiver.at("bursty")) >= 40, timeout=30)
    at = [r.at for r in receiver.at("bursty")]
    print("arrivals, s after the first:", [round(t - at[0], 3) for t in at])
    # An idle bucket holds the burst: ten at once, the eleventh a start later.
    assert at[9] - at[0] < 0.3
    assert at[10] - at[0] > 0.1
    # Then 5/s: the rest are spaced by the bucket (each start scheduled
    # from it, not from the one before, so lateness does not add up).
    tail = at[10:]
    rate = (len(tail) - 1) / (tail[-1] - tail[0])
    print(f"after the burst: {rate:.2f}/s, busiest second {_busiest_second(tail)}")
    assert 5 * 0.95 <= rate <= 5 * 1.05
    assert _busiest_second(tail) <= _second_bound(5)
    assert len(receiver.at("bursty")) == 40


async def _effective(db, name: str) -> int:
    [health] = await store.endpoint_health(db, endpoint=("default", name))
    return health.effective_concurrency


def _reaches(db, name: str, limit: int):
    async def check() -> bool:
        return await _effective(db, name) == limit

    return check


class Overloaded:
    """A receiver path that answers 429 when more than ``capacity`` calls
    are open at once; each call, accepted or not, takes ``seconds``.
    ``overloading`` false: it accepts every call."""

    def __init__(self, receiver: Receiver, path: str, capacity: int, seconds: float) -> None:
        self.receiver, self.path, self.capacity, self.seconds = receiver, "/" + path, capacity, seconds
        self.overloading = True
        self.refused: list[float] = []

    def __call__(self, _index: int) -> Answer:
        # The receiver counts this call as open only once it has its answer.
        if self.overloading and self.receiver.in_flight[self.path] >= self.capacity:
            self.refused.append(time.time())
            return Answer(429, delay=self.seconds)
        return Answer(200, delay=self.seconds)


async def _delivered(db) -> int:
    return await db.fetchval("SELECT count(*) FROM deliveries WHERE state = 'delivered'")


async def test_adaptive_concurrency_finds_the_receivers_capacity_and_recovers(db, receiver, start_worker):
    step = 0.3
    answer = Overloaded(receiver, "adaptive", capacity=2, seconds=0.05)
    await add_endpoint(
        db,
        "adaptive",
        receiver.on("adaptive", answer),
        max_concurrency=8,
        delivery=DeliverySpec(adaptive=True),
    )
    await _backlog(db, "acme", 2000)
    start_worker(adaptive_step_seconds=step)
    await wait_for(_reaches(db, "adaptive", 2), timeout=30, interval=0.02)
    settled, refused, delivered = time.time(), len(answer.refused), await _delivered(db)
    seen: set[int] = set()

    async def delivered_200_more() -> bool:
        seen.add(await _effective(db, "adaptive"))
        return await _delivered(db) >= delivered + 200

    # 200 deliveries at 2 or 3 in flight are some twenty steps.
    await wait_for(delivered_200_more, timeout=60, interval=0.02)
    elapsed, n429 = time.time() - settled, len(answer.refused) - refused
    print(
        f"settled: limits seen {sorted(seen)}, {n429} 429s in {elapsed:.1f} s"
        f" ({elapsed / step:.0f} steps) = {n429 / elapsed * 60:.0f}/min"
    )
    # It stays at the receiver's capacity, probing one above it: each probe
    # costs a 429 or so, once a step. Without the limit moving, the six
    # calls beyond the capacity would each be refused every 50 ms.
    assert seen <= {2, 3}
    assert 0 < n429 <= 3 * elapsed / step
    assert receiver.peak["/adaptive"] == 8  # before it came down

    answer.overloading = False
    recovering = time.time()
    await wait_for(_reaches(db, "adaptive", 8), timeout=30, interval=0.02)
    print(f"back to 8 in {time.time() - recovering:.1f} s")
    [health] = await store.endpoint_health(db, endpoint=("default", "adaptive"))
    assert health.max_concurrency == 8 and health.adaptive_concurrency


async def test_a_receiver_refusing_everything_gets_one_call_a_step(db, receiver, start_worker):
    """Every call refused at once, without a Retry-After: the limit falls
    a generation of calls at a time, not a step at a time, and at 1 each
    refusal holds the endpoint for a step, so the refusals come a step
    apart instead of one per answer. (The circuit, which such a receiver
    opens after 20 refusals, is kept out of the way.)"""
    step = 1.0
    await add_endpoint(
        db,
        "refusing",
        receiver.on("refusing", Answer(429)),
        max_concurrency=10,
        delivery=DeliverySpec(adaptive=True),
    )
    await _backlog(db, "acme", 500)
    started = time.time()
    start_worker(adaptive_step_seconds=step, circuit=CircuitPolicy(threshold=10_000))
    await wait_for(_reaches(db, "refusing", 1), timeout=30, interval=0.02)
    fell_in, floor_reached = time.time() - started, len(receiver.at("refusing"))
    await wait_for(lambda: time.time() - started >= fell_in + 4 * step, timeout=30)
    after = receiver.at("refusing")[floor_reached:]
    print(
        f"down to 1 in {fell_in:.2f} s after {floor_reached} refusals; {len(after)} in the next {4 * step:g} s"
    )
    # 10, 7, 4, 2, 1: four generations of calls, each a round trip.
    assert fell_in < step
    # A call a step at 1, the one in flight at the fall, and a hold that
    # may end as the window does.
    assert len(after) <= 4 + 2
    [health] = await store.endpoint_health(db, endpoint=("default", "refusing"))
    assert health.effective_concurrency == 1 and health.throttled_until is not None


async def test_a_retry_after_holds_the_whole_endpoint(db, receiver, start_worker):
    holding = {30: Answer(429, headers={"Retry-After": "2"})}
    url = receiver.on("held", lambda i: holding.get(i, Answer(200, delay=0.05)))
    await add_endpoint(db, "held", url, max_concurrency=4, delivery=DeliverySpec(adaptive=True))
    await _backlog(db, "acme", 200)
    start_worker()
    await wait_for(lambda: len(receiver.at("held")) > 40, timeout=30)
    at = [r.at for r in receiver.at("held")]
    asked = at[30]
    throttled_until = float(await db.fetchval("SELECT extract(epoch FROM throttled_until) FROM endpoints"))
    late = [round(t - asked, 3) for t in at[31:]]
    print(f"hold recorded {throttled_until - 2 - asked:.3f} s after the 429; arrivals after it: {late[:12]}")
    # The hold runs 2 s from when the 429 is recorded. The calls already
    # in flight, or granted by a round that ran alongside the record,
    # arrive within a moment of it (0.2 s leaves room for a slow loop);
    # after that, none until the hold ends, from any slot.
    assert throttled_until >= asked + 2
    recorded = throttled_until - 2
    assert not [t for t in at[31:] if recorded + 0.2 <= t < throttled_until]
    assert [t for t in at[31:] if t >= throttled_until]

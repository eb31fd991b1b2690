"""spec.delivery's rate limit and adaptive concurrency, against real
receivers: a burst, a slow reservation, and a limit that follows the
receiver's overload signals. Across worker processes, one of them killed:
tests/processes/test_rate_limit.py."""

from __future__ import annotations

import statistics
import time

from hooklane import store
from hooklane.delivery import DeliverySpec
from hooklane.policies import CircuitPolicy
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.rate_limit import busiest_second, grants_between, log_grants, second_bound
from testsupport.receivers import Answer, Receiver


async def _backlog(db, tenant: str, n: int, event_type: str = "bulk.item") -> None:
    """``n`` events of ``tenant`` published in one transaction."""
    async with db.transaction():
        await store.insert_events(
            db, [store.Event(f"{tenant}-{i}", tenant, event_type, f'{{"i": {i}}}') for i in range(n)]
        )


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
    await log_grants(db)
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
    grants = await grants_between(db, paced, since - 1, time.time())
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
    print(f"after the burst: {rate:.2f}/s, busiest second {busiest_second(tail)}")
    assert 5 * 0.95 <= rate <= 5 * 1.05
    assert busiest_second(tail) <= second_bound(5)
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

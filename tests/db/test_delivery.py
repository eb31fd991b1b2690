"""What receivers see, with a worker in the test's event loop and real
receivers on loopback."""

from __future__ import annotations

import time
from datetime import UTC, datetime

import hooklane
from hooklane import metrics
from hooklane.policies import CircuitPolicy
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer


async def _publish(db, n=1, tenant="acme"):
    return [await hooklane.publish(db, tenant=tenant, type="order.created", data={"n": i}) for i in range(n)]


async def _delivery(db):
    return await db.fetchrow("SELECT * FROM deliveries ORDER BY id LIMIT 1")


async def test_a_receiver_that_never_answers_is_cut_at_the_deadline(db, receiver, start_worker):
    await add_endpoint(db, "hang", receiver.on("hang", Answer(hang=True)), timeout_seconds=1)
    await _publish(db)
    start_worker()
    await wait_for(lambda: receiver.at("hang"))
    arrived = time.time()
    row = await wait_for(
        lambda: db.fetchrow("SELECT * FROM deliveries WHERE state = 'pending' AND attempts = 1")
    )
    assert time.time() - arrived < 2.5
    assert row["last_error"].startswith("timeout") and row["last_status"] is None
    assert row["next_attempt_at"] > datetime.now(UTC)


async def test_a_slow_response_past_the_deadline_fails(db, receiver, start_worker):
    await add_endpoint(db, "slow", receiver.on("slow", Answer(200, delay=2.0)), timeout_seconds=1)
    await _publish(db)
    start_worker()
    row = await wait_for(
        lambda: db.fetchrow("SELECT * FROM deliveries WHERE attempts = 1 AND state = 'pending'")
    )
    assert row["last_error"].startswith("timeout")


async def test_redirects_are_failures_and_never_followed(db, receiver, start_worker):
    target = receiver.on("elsewhere", Answer(200))
    await add_endpoint(db, "moved", receiver.on("moved", Answer(302, headers={"Location": target})))
    await add_endpoint(db, "perm", receiver.on("perm", Answer(308, headers={"Location": target})))
    await _publish(db)
    start_worker()
    rows = await wait_for(
        lambda: _all(db, "SELECT * FROM deliveries WHERE attempts = 1 AND state = 'pending'", 2)
    )
    assert sorted(r["last_status"] for r in rows) == [302, 308]
    assert receiver.at("elsewhere") == []


async def test_410_deactivates_and_kills_the_delivery(db, receiver, start_worker):
    await add_endpoint(db, "gone", receiver.on("gone", Answer(410)))
    await _publish(db)
    start_worker()
    await wait_for(lambda: db.fetchval("SELECT state = 'deactivated' FROM endpoints"))
    row = await _delivery(db)
    assert (row["state"], row["last_status"]) == ("dead", 410)
    # a deactivated endpoint gets no new deliveries, and its events are kept
    await _publish(db)
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 1
    assert await db.fetchval("SELECT count(*) FROM events") == 2


async def test_413_is_dead_at_once(db, receiver, start_worker):
    await add_endpoint(db, "big", receiver.on("big", Answer(413)))
    await _publish(db)
    start_worker()
    row = await wait_for(lambda: db.fetchrow("SELECT * FROM deliveries WHERE state = 'dead'"))
    assert row["attempts"] == 1 and row["last_status"] == 413
    assert await db.fetchval("SELECT state FROM endpoints") == "active"


async def test_429_retry_after_is_honoured(db, receiver, start_worker):
    await add_endpoint(db, "busy", receiver.on("busy", Answer(429, headers={"Retry-After": "3600"})))
    await _publish(db)
    start_worker()
    row = await wait_for(
        lambda: db.fetchrow("SELECT * FROM deliveries WHERE attempts = 1 AND state = 'pending'")
    )
    wait = (row["next_attempt_at"] - datetime.now(UTC)).total_seconds()
    assert 3590 < wait <= 3600
    assert row["last_status"] == 429


async def test_failures_back_off_and_are_never_immediate(db, receiver, start_worker):
    await add_endpoint(db, "err", receiver.on("err", Answer(500)))
    await _publish(db, 5)
    start_worker()
    rows = await wait_for(
        lambda: _all(db, "SELECT * FROM deliveries WHERE attempts = 1 AND state = 'pending'", 5)
    )
    now = datetime.now(UTC)
    waits = [(r["next_attempt_at"] - now).total_seconds() for r in rows]
    assert all(13 < w <= 30 for w in waits), waits
    assert len(receiver.at("err")) == 5


async def test_a_huge_response_counts_by_its_status_alone(db, receiver, start_worker):
    await add_endpoint(db, "huge", receiver.on("huge", Answer(200, body_bytes=10 * 1024 * 1024)))
    await _publish(db, 3)
    start_worker()
    await wait_for(lambda: _all(db, "SELECT * FROM deliveries WHERE state = 'delivered'", 3))


async def test_circuit_opens_after_20_failures_probes_then_closes(db, receiver, start_worker):
    answer = {"now": Answer(500, delay=0.2)}
    url = receiver.on("flaky", lambda _i: answer["now"])
    await add_endpoint(db, "flaky", url, max_concurrency=4)
    await _publish(db, 20)
    start_worker(circuit=CircuitPolicy(threshold=20, step_seconds=1.0, cap_seconds=1.5))
    await wait_for(lambda: db.fetchval("SELECT paused_until IS NOT NULL FROM endpoints"))
    opened = time.time()
    assert len(receiver.at("flaky")) == 20
    await _publish(db, 12)  # due now, but the circuit holds them
    await wait_for(lambda: len(receiver.at("flaky")) >= 28, timeout=20)
    probes = [r.at for r in receiver.at("flaky") if r.at > opened]
    rounds = _bursts(probes, gap=0.6)
    assert len(rounds) >= 2
    assert all(len(burst) <= 4 for burst in rounds), [len(b) for b in rounds]
    assert receiver.peak["/flaky"] <= 4
    answer["now"] = Answer(204)
    await wait_for(
        lambda: db.fetchval(
            "SELECT count(*) = 0 FROM deliveries WHERE state <> 'delivered' AND next_attempt_at <= now()"
        ),
        timeout=20,
    )
    ep = await db.fetchrow("SELECT consecutive_failures, paused_until, failing_since FROM endpoints")
    assert tuple(ep) == (0, None, None)


async def test_metrics_count_outcomes_and_per_endpoint_gauges(db, receiver, start_worker):
    before = metrics.DELIVERIES.labels("delivered")._value.get()
    await add_endpoint(db, "ok", receiver.on("ok", Answer(204)))
    await add_endpoint(db, "stuck", receiver.on("stuck", Answer(200)), paused=True)
    await _publish(db, 3)
    start_worker()
    await wait_for(lambda: metrics.DELIVERIES.labels("delivered")._value.get() - before >= 3)
    await wait_for(lambda: metrics.ENDPOINT_PENDING.labels("default", "stuck")._value.get() == 3)
    await wait_for(lambda: metrics.ENDPOINT_OLDEST_PENDING_AGE.labels("default", "stuck")._value.get() > 0)
    assert metrics.ENDPOINTS_PAUSED.labels("manual")._value.get() == 1


async def _all(db, sql, n):
    rows = await db.fetch(sql)
    return rows if len(rows) >= n else None


def _bursts(times: list[float], gap: float) -> list[list[float]]:
    bursts: list[list[float]] = []
    for t in sorted(times):
        if bursts and t - bursts[-1][-1] < gap:
            bursts[-1].append(t)
        else:
            bursts.append([t])
    return bursts


async def test_a_delivery_that_cannot_even_be_attempted_is_recorded_as_failed(db, receiver, start_worker):
    await add_endpoint(db, "broken", receiver.on("broken", Answer(204)))
    # a malformed secret written behind the store's checks
    await db.execute("UPDATE endpoints SET secret = 'whsec_broken'")
    await _publish(db)
    start_worker()
    row = await wait_for(
        lambda: db.fetchrow("SELECT * FROM deliveries WHERE attempts = 1 AND state = 'pending'")
    )
    assert row["last_error"].startswith("invalid endpoint: secret:") and receiver.at("broken") == []
    assert row["next_attempt_at"] > datetime.now(UTC)

"""Ordered delivery per key (issue 42) through ``hooklane worker``
processes to real receivers: what a receiver sees of each key."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from hooklane import store
from testsupport.cli import hooklane
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.ordering import key_row, publish
from testsupport.receivers import (
    ORDERING_KEY,
    ORDERING_SEQUENCE,
    Answer,
    Receiver,
    numbers_by_key,
    order_broken,
)

KEYS = [f"order-{i}" for i in range(5)]
EVENTS_PER_KEY = 6


@pytest.fixture
def workers(dsn: str):
    started: list[subprocess.Popen] = []

    def start(**env: str) -> subprocess.Popen:
        proc = worker_process(dsn, **env)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=10)


async def test_each_key_arrives_in_order_one_at_a_time_while_others_flow(db, receiver: Receiver, workers):
    wide = await add_endpoint(db, "wide", receiver.on("wide", Answer(204, delay=0.02)), max_concurrency=4)
    await add_endpoint(db, "narrow", receiver.on("narrow", Answer(204, delay=0.02)), max_concurrency=2)
    # The wide endpoint's first key is held open at its head: the other
    # keys, and the other endpoint, must go on meanwhile.
    gate = asyncio.Event()
    receiver.on_key("wide", KEYS[0], lambda i: Answer(204, held=gate) if i == 0 else Answer(204))
    for _ in range(EVENTS_PER_KEY):
        for key in KEYS:
            await publish(db, key)
        await publish(db, None)
    workers()

    def done(path: str, keys: list[str]) -> bool:
        got = numbers_by_key(receiver.at(path))
        return all(len(got.get(k, [])) >= EVENTS_PER_KEY for k in keys)

    await wait_for(lambda: done("wide", KEYS[1:]) and done("narrow", KEYS), timeout=60)
    assert numbers_by_key(receiver.at("wide"))[KEYS[0]] == [1]
    assert receiver.key_in_flight[("/wide", KEYS[0])] == 1
    gate.set()
    await wait_for(lambda: done("wide", KEYS), timeout=60)
    await wait_for(
        lambda: db.fetchval("SELECT count(*) = 0 FROM deliveries WHERE state <> 'delivered'"), timeout=30
    )

    for path in ("wide", "narrow"):
        got = numbers_by_key(receiver.at(path))
        assert order_broken(got) == []
        assert got == {k: list(range(1, EVENTS_PER_KEY + 1)) for k in KEYS}, path
        assert all(receiver.key_peak[(f"/{path}", k)] == 1 for k in KEYS), dict(receiver.key_peak)
        assert len(receiver.at(path)) == EVENTS_PER_KEY * (len(KEYS) + 1)
        # An unordered delivery carries neither header.
        unordered = [r for r in receiver.at(path) if ORDERING_KEY not in r.headers]
        assert len(unordered) == EVENTS_PER_KEY
        assert not any(ORDERING_SEQUENCE in r.headers for r in unordered)
    # Keys in parallel, within the endpoint's limit.
    assert 1 < receiver.peak["/wide"] <= 4
    assert receiver.peak["/narrow"] <= 2
    assert (await key_row(db, wide, KEYS[0]))["head_seq"] is None


async def test_a_receiver_failing_a_head_holds_only_its_key(db, dsn, receiver: Receiver, workers):
    endpoint = await add_endpoint(db, "shop", receiver.on("shop", Answer(204)), max_concurrency=2)
    await add_endpoint(db, "audit", receiver.on("audit", Answer(204)))
    receiver.on_key("shop", "bad", Answer(500))
    for _ in range(3):
        await publish(db, "bad")
        await publish(db, "good")
    workers(
        HOOKLANE_RETRY_MAX_ATTEMPTS="2", HOOKLANE_RETRY_BASE_SECONDS="0.1", HOOKLANE_RETRY_CAP_SECONDS="0.2"
    )

    async def held() -> bool:
        row = await key_row(db, endpoint, "bad")
        return row is not None and row["held_since"] is not None

    await wait_for(held, timeout=60)
    await wait_for(lambda: len(numbers_by_key(receiver.at("shop")).get("good", [])) == 3, timeout=30)
    await wait_for(lambda: len(receiver.at("audit")) == 6, timeout=30)
    # Proof that the worker went on past the dead head: a key published
    # after it was held arrives, and the held key's later ones do not.
    await publish(db, "later")
    await wait_for(lambda: "later" in numbers_by_key(receiver.at("shop")), timeout=30)

    got = numbers_by_key(receiver.at("shop"))
    assert got["bad"] == [1, 1]  # its two attempts, nothing behind it
    assert got["good"] == [1, 2, 3]
    assert numbers_by_key(receiver.at("audit")) == {"bad": [1, 2, 3], "good": [1, 2, 3], "later": [1]}
    states = await db.fetch(
        "SELECT ordering_seq, state, next_attempt_at = 'infinity' AS waiting FROM deliveries"
        " WHERE endpoint_id = $1 AND ordering_key = 'bad' ORDER BY ordering_seq",
        endpoint,
    )
    assert [tuple(r) for r in states] == [(1, "dead", False), (2, "pending", True), (3, "pending", True)]

    # Resent once the receiver takes it, the head goes first, under its
    # own number, and the key's later deliveries follow it.
    receiver.on_key("shop", "bad", Answer(204))
    resent = await asyncio.to_thread(hooklane, dsn, "endpoint", "resend", "shop")
    assert resent.returncode == 0, resent.stderr
    await wait_for(lambda: numbers_by_key(receiver.at("shop"))["bad"][-1] == 3, timeout=30)
    assert numbers_by_key(receiver.at("shop"))["bad"] == [1, 1, 1, 2, 3]
    assert all(peak == 1 for (path, key), peak in receiver.key_peak.items() if key)
    assert (await key_row(db, endpoint, "bad"))["held_since"] is None


async def test_a_head_completed_while_a_publisher_holds_its_key_is_followed(
    db, dsn, receiver: Receiver, workers
):
    endpoint = await add_endpoint(db, "shop", receiver.on("shop", Answer(204)))
    gate = asyncio.Event()
    receiver.on_key("shop", "k", lambda i: Answer(204, held=gate) if i == 0 else Answer(204))
    await publish(db, "k")
    workers()
    await wait_for(lambda: receiver.at("shop"), timeout=30)

    # A publisher's transaction holds the key's row while the head's result
    # is recorded: the worker does not wait for it, and once it commits the
    # delivery it queued is sent (the worker's retry of the busy key, or its
    # sweep), after the head.
    publisher = await store.connect(dsn)
    try:
        tx = publisher.transaction()
        await tx.start()
        late = await publish(publisher, "k")
        gate.set()
        await wait_for(
            lambda: db.fetchval(
                "SELECT state = 'delivered' FROM deliveries WHERE endpoint_id = $1 AND ordering_seq = 1",
                endpoint,
            ),
            timeout=30,
        )
        await tx.commit()
    finally:
        await publisher.close()
    await wait_for(lambda: len(receiver.at("shop")) == 2, timeout=30)
    second = receiver.at("shop")[1]
    assert numbers_by_key(receiver.at("shop")) == {"k": [1, 2]}
    assert second.headers["webhook-id"] == late

"""Ordered delivery per key (issue 42) at the SQL level, on a real
Postgres: the numbering a publish gives, the lock that makes it follow the
commit order, and the reservation and results that keep one delivery of a
key outstanding, called as the publishers and the worker call them."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooklane import store
from hooklane.errors import TransientStoreError
from testsupport.fixtures import ALL_PARTITIONS, add_endpoint, wait_for
from testsupport.ordering import (
    advance,
    complete,
    delivered,
    deliveries_of,
    died,
    key_row,
    publish,
    resend,
    reserve,
    retried,
    sweep,
    sweep_v1,
)


@pytest.fixture
async def other(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    """A second connection: another publisher's, or a worker's."""
    conn = await store.connect(dsn)
    yield conn
    await conn.close()


@pytest.fixture
async def third(dsn: str) -> AsyncIterator[asyncpg.Connection]:
    conn = await store.connect(dsn)
    yield conn
    await conn.close()


async def _blocked_by(db: asyncpg.Connection, waiter: asyncpg.Connection, holder: asyncpg.Connection) -> bool:
    """Whether ``waiter``'s statement waits for a lock ``holder`` holds."""
    return bool(
        await db.fetchval(
            "SELECT $2::int = ANY(pg_blocking_pids($1::int))"
            " AND (SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1::int)",
            waiter.get_server_pid(),
            holder.get_server_pid(),
        )
    )


def _seqs(rows) -> list[tuple[str, int]]:
    return sorted((r["ordering_key"], r["ordering_seq"]) for r in rows)


async def test_numbered_per_endpoint_and_key_in_commit_order(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    b = await add_endpoint(db, "b", "http://127.0.0.1:1/b", event_types=("order.updated",))
    # The earlier transaction commits its event of the key later: it comes
    # second, whatever its events' times say.
    async with other.transaction():
        await publish(other, None)
        first = await publish(db, "order-1")
        late = await publish(other, "order-1")
    await publish(db, "order-2", type="order.created")  # to a only
    third = await publish(db, "order-1")

    assert [(o.event_id, o.seq) for o in await deliveries_of(db, a, "order-1")] == [
        (first, 1),
        (late, 2),
        (third, 3),
    ]
    assert [(o.event_id, o.seq) for o in await deliveries_of(db, b, "order-1")] == [
        (first, 1),
        (late, 2),
        (third, 3),
    ]
    assert [o.seq for o in await deliveries_of(db, a, "order-2")] == [1]
    assert await deliveries_of(db, b, "order-2") == []
    # Only the head of each key is due; the others wait behind it.
    for endpoint in (a, b):
        assert [(o.due, o.waiting) for o in await deliveries_of(db, endpoint, "order-1")] == [
            (True, False),
            (False, True),
            (False, True),
        ]
        row = await key_row(db, endpoint, "order-1")
        assert (row["last_seq"], row["head_seq"], row["held_since"]) == (3, 1, None)


async def test_a_second_publisher_of_the_key_waits_for_the_first_to_commit(db, other, third):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a", event_types=("order.updated",))
    b = await add_endpoint(db, "b", "http://127.0.0.1:1/b", event_types=("order.paid",))
    first = other.transaction()
    await first.start()
    early = await publish(other, "order-1")
    second = third.transaction()
    await second.start()
    waiting = asyncio.create_task(publish(third, "order-1"))
    await wait_for(lambda: _blocked_by(db, third, other))

    # No other publisher waits: another key to the same endpoint, the same
    # key of another tenant, an unordered event. A wait would end in
    # lock_timeout's error rather than pass.
    await db.execute("SET lock_timeout = '10s'")
    await publish(db, "order-2")
    await publish(db, "order-1", tenant="globex")
    await publish(db, None)
    assert not waiting.done()

    await first.commit()
    late = await waiting
    await second.commit()
    # The same key to another endpoint takes its place after both.
    await publish(db, "order-1", type="order.paid")
    assert [(o.event_id, o.seq, o.due) for o in await deliveries_of(db, a, "order-1")] == [
        (early, 1, True),
        (late, 2, False),
    ]
    assert [o.seq for o in await deliveries_of(db, a, "order-2")] == [1]
    assert [o.seq for o in await deliveries_of(db, b, "order-1")] == [1]
    positions = await db.fetch(
        "SELECT ordering_position FROM events WHERE tenant = 'acme' AND ordering_key = 'order-1' ORDER BY 1"
    )
    assert [p["ordering_position"] for p in positions] == [1, 2, 3]


async def test_only_heads_are_reserved_and_other_keys_use_the_concurrency(db):
    narrow = await add_endpoint(db, "narrow", "http://127.0.0.1:1/n", max_concurrency=3)
    wide = await add_endpoint(db, "wide", "http://127.0.0.1:1/w", max_concurrency=10)
    for _ in range(3):
        for key in ("k1", "k2", "k3", "k4", "k5"):
            await publish(db, key)

    rows = await reserve(db, limit=100)
    by_endpoint = {e: [r for r in rows if r["endpoint_id"] == e] for e in (narrow, wide)}
    # One delivery per key, its head: the narrow endpoint up to its
    # maxConcurrency, the wide one every key (5 of its 10).
    assert len(by_endpoint[narrow]) == 3
    assert len({r["ordering_key"] for r in by_endpoint[narrow]}) == 3
    assert _seqs(by_endpoint[wide]) == [(k, 1) for k in ("k1", "k2", "k3", "k4", "k5")]
    assert {r["ordering_seq"] for r in rows} == {1}
    assert await reserve(db, limit=100) == []

    # The wide endpoint's k1 delivered: its next is due, and the only one.
    (k1,) = [r for r in by_endpoint[wide] if r["ordering_key"] == "k1"]
    touched = await complete(db, [(k1, delivered(k1))])
    assert [t["ordering_busy"] for t in touched] == [None]
    assert touched[0]["retried_head"] is not None  # the worker's ready list is told
    row = await key_row(db, wide, "k1")
    assert (row["last_seq"], row["head_seq"]) == (3, 2)
    rows = await reserve(db, limit=100)
    assert _seqs(rows) == [("k1", 2)]
    assert rows[0]["endpoint_id"] == wide


async def test_the_last_delivered_leaves_nothing_outstanding(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await publish(db, "k")
    await publish(db, "k")
    sent = []
    while rows := await reserve(db):
        assert len(rows) == 1
        sent.append(rows[0]["ordering_seq"])
        await complete(db, [(rows[0], delivered(rows[0]))])
    assert sent == [1, 2]
    row = await key_row(db, a, "k")
    assert (row["last_seq"], row["head_seq"]) == (2, None)
    # The next publish of the key is due at once, the key's head.
    await publish(db, "k")
    assert [(o.seq, o.due) for o in await deliveries_of(db, a, "k") if o.state == "pending"] == [(3, True)]


async def test_a_retried_head_keeps_its_key_waiting_and_no_other(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for key in ("k1", "k2", "k1", "k2"):
        await publish(db, key)
    rows = await reserve(db)
    assert _seqs(rows) == [("k1", 1), ("k2", 1)]
    k1, k2 = sorted(rows, key=lambda r: r["ordering_key"])
    await complete(db, [(k1, retried(k1)), (k2, delivered(k2))])

    assert [(o.seq, o.state, o.due, o.waiting) for o in await deliveries_of(db, a, "k1")] == [
        (1, "pending", False, False),  # its backoff
        (2, "pending", False, True),
    ]
    assert _seqs(await reserve(db)) == [("k2", 2)]
    row = await key_row(db, a, "k1")
    assert (row["head_seq"], row["held_since"]) == (1, None)


async def test_a_dead_head_holds_its_key_until_resent(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for _ in range(3):
        await publish(db, "k1")
        await publish(db, "k2")
    rows = await reserve(db)
    k1, k2 = sorted(rows, key=lambda r: r["ordering_key"])
    await complete(db, [(k1, died(k1)), (k2, delivered(k2))])
    row = await key_row(db, a, "k1")
    assert row["held_since"] is not None and row["head_seq"] == 1 and row["skipped"] == 0

    # k2 goes on to its end; nothing of k1 is reserved meanwhile.
    sent = []
    while rows := await reserve(db):
        sent += _seqs(rows)
        await complete(db, [(r, delivered(r)) for r in rows])
    assert sent == [("k2", 2), ("k2", 3)]
    assert [(o.seq, o.state, o.waiting) for o in await deliveries_of(db, a, "k1")] == [
        (1, "dead", False),
        (2, "pending", True),
        (3, "pending", True),
    ]
    # The sweep leaves a held key as it is.
    assert await sweep(db) == []

    # Resent, the head goes again under its own number and the key is no
    # longer held; the rest follow it.
    await resend(db, "default", "a", [k1["id"]])
    row = await key_row(db, a, "k1")
    assert (row["held_since"], row["head_seq"], row["last_seq"]) == (None, 1, 3)
    sent = []
    while rows := await reserve(db):
        sent += _seqs(rows)
        await complete(db, [(r, delivered(r)) for r in rows])
    assert sent == [("k1", 1), ("k1", 2), ("k1", 3)]


async def test_a_held_head_discarded_lets_its_key_go_on(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await publish(db, "k")
    later = await publish(db, "k")
    (head,) = await reserve(db)
    await complete(db, [(head, died(head))])
    assert (await key_row(db, a, "k"))["held_since"] is not None
    assert await reserve(db) == []

    discarded = await store.discard_dead(db, "default", "a", [head["id"]], "test")
    assert discarded is not None and discarded.count == 1
    row = await key_row(db, a, "k")
    assert (row["held_since"], row["head_seq"], row["skipped"]) == (None, 2, 0)
    (sent,) = await reserve(db)
    assert (sent["event_id"], sent["ordering_seq"]) == (later, 2)


async def test_a_held_key_goes_on_once_its_endpoint_skips(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await publish(db, "k")
    await publish(db, "k")
    (head,) = await reserve(db)
    await complete(db, [(head, died(head))])
    assert (await key_row(db, a, "k"))["held_since"] is not None
    # The policy changed after the head died: the sweep moves the key on.
    await db.execute("UPDATE endpoints SET ordering_on_dead = 'skip' WHERE id = $1", a)
    assert await sweep(db) == [(a, "k")]
    row = await key_row(db, a, "k")
    assert (row["held_since"], row["head_seq"], row["skipped"]) == (None, 2, 1)
    assert _seqs(await reserve(db)) == [("k", 2)]


async def test_a_dead_head_is_skipped_and_resent_at_the_tail(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("UPDATE endpoints SET ordering_on_dead = 'skip' WHERE id = $1", a)
    events = [await publish(db, "k") for _ in range(3)]
    (head,) = await reserve(db)
    await complete(db, [(head, died(head))])
    row = await key_row(db, a, "k")
    assert (row["held_since"], row["head_seq"], row["skipped"]) == (None, 2, 1)
    assert [(o.seq, o.state, o.due) for o in await deliveries_of(db, a, "k")] == [
        (1, "dead", False),
        (2, "pending", True),
        (3, "pending", False),
    ]

    # Resent, the skipped delivery takes a new number behind the key's
    # others: a receiver never gets a lower number after a higher one.
    await resend(db, "default", "a", [head["id"]])
    assert [(o.seq, o.due, o.waiting) for o in await deliveries_of(db, a, "k") if o.state == "pending"] == [
        (2, True, False),
        (3, False, True),
        (4, False, True),
    ]
    sent = []
    while rows := await reserve(db):
        sent += [(r["event_id"], r["ordering_seq"]) for r in rows]
        await complete(db, [(r, delivered(r)) for r in rows])
    assert sent == [(events[1], 2), (events[2], 3), (events[0], 4)]
    row = await key_row(db, a, "k")
    assert (row["last_seq"], row["head_seq"], row["skipped"]) == (4, None, 1)


async def test_a_skipped_delivery_resent_when_the_key_is_idle_is_due_at_once(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await db.execute("UPDATE endpoints SET ordering_on_dead = 'skip' WHERE id = $1", a)
    await publish(db, "k")
    (head,) = await reserve(db)
    await complete(db, [(head, died(head))])
    assert (await key_row(db, a, "k"))["head_seq"] is None
    await resend(db, "default", "a", [head["id"]])
    assert _seqs(await reserve(db)) == [("k", 2)]


async def test_a_coalesce_key_replaces_only_the_tail_of_its_ordering_key(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await publish(db, "k", coalesce_key="c")
    second = await publish(db, "k", coalesce_key="c")
    # The pending head was also the tail: replaced, with the new number.
    assert [(o.event_id, o.seq, o.due) for o in await deliveries_of(db, a, "k")] == [(second, 2, True)]
    assert (await key_row(db, a, "k"))["head_seq"] == 2

    fact = await publish(db, "k")
    state = await publish(db, "k", coalesce_key="c")
    # The coalesce key's delivery is not the tail now: queued behind.
    assert [(o.event_id, o.seq) for o in await deliveries_of(db, a, "k")] == [
        (second, 2),
        (fact, 3),
        (state, 4),
    ]
    latest = await publish(db, "k", coalesce_key="c")
    assert [(o.event_id, o.seq, o.due) for o in await deliveries_of(db, a, "k")] == [
        (second, 2, True),
        (fact, 3, False),
        (latest, 5, False),
    ]

    # A head in flight is not pending: never replaced.
    sent = []
    while rows := await reserve(db):
        sent += [(r["event_id"], r["ordering_seq"]) for r in rows]
        if len(sent) == 1:
            newer = await publish(db, "k", coalesce_key="c")
        await complete(db, [(r, delivered(r)) for r in rows])
    assert sent == [(second, 2), (fact, 3), (newer, 6)]


async def test_a_completion_does_not_wait_for_a_publisher_of_the_key(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await publish(db, "k")
    (head,) = await reserve(db)
    publishing = other.transaction()
    await publishing.start()
    late = await publish(other, "k")

    # A wait would end in lock_timeout's error.
    await db.execute("SET lock_timeout = '10s'")
    touched = await complete(db, [(head, delivered(head))])
    assert [t["ordering_busy"] for t in touched] == [["k"]]
    await publishing.commit()
    assert [(o.seq, o.state, o.waiting) for o in await deliveries_of(db, a, "k")] == [
        (1, "delivered", False),
        (2, "pending", True),
    ]

    # Tried again once the publisher committed, the key moves on.
    moved = await advance(db, [(a, "k")])
    assert [(r["endpoint_id"], r["key"], r["due"] is not None) for r in moved] == [(a, "k", True)]
    (row,) = await reserve(db)
    assert (row["event_id"], row["ordering_seq"]) == (late, 2)


async def test_advance_reports_a_busy_key_and_moves_the_others(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for key in ("k1", "k2", "k1", "k2"):
        await publish(db, key)
    rows = await reserve(db)
    publishing = other.transaction()
    await publishing.start()
    await publish(other, "k1")
    touched = await complete(db, [(r, delivered(r)) for r in rows])
    assert [t["ordering_busy"] for t in touched] == [["k1"]]
    assert _seqs(await reserve(db)) == [("k2", 2)]
    await publishing.rollback()
    assert [r["key"] for r in await advance(db, [(a, "k1")])] == ["k1"]
    assert _seqs(await reserve(db)) == [("k1", 2)]


# v1: as a worker of the release before calls it, during a rolling upgrade.
@pytest.mark.parametrize("sweeper", [sweep, sweep_v1], ids=["v2", "v1"])
async def test_the_sweep_moves_on_a_key_whose_head_settled_without_advance(db, sweeper):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for key in ("k1", "k2", "k1", "k2"):
        await publish(db, key)
    rows = await reserve(db)
    k1, k2 = sorted(rows, key=lambda r: r["ordering_key"])
    # Recorded without moving the keys on, as by a worker that died between
    # the two, or one of the release before (hooklane_complete_v5).
    await complete(db, [(_unordered(k1), delivered(k1)), (_unordered(k2), died(k2))])
    assert await reserve(db) == []
    assert (await key_row(db, a, "k2"))["held_since"] is None

    assert await sweeper(db) == [(a, "k1")]
    # The dead head under 'hold' now holds its key.
    assert (await key_row(db, a, "k2"))["held_since"] is not None
    assert _seqs(await reserve(db)) == [("k1", 2)]
    assert await sweeper(db) == []


async def test_the_sweep_walks_its_partitions_keys_a_page_at_a_time(db):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    b = await add_endpoint(db, "b", "http://127.0.0.1:1/b")
    partition = dict(await db.fetch("SELECT id, partition FROM endpoints"))
    assert partition[a] != partition[b], "the names hash to different partitions"
    # As many as an endpoint's default concurrency: every head reserved.
    keys = [f"k{i}" for i in range(4)]
    for key in keys * 2:
        await publish(db, key)
    heads = await reserve(db)
    assert len(heads) == 2 * len(keys)
    await complete(db, [(_unordered(r), delivered(r)) for r in heads])

    # a's partition only, two keys a page: each page goes on after the
    # last, and the walk ends with a page short of two.
    woken, cursors, after = [], [], None
    while True:
        swept = await store.sweep_ordering(db, [partition[a]], after, 2)
        woken += swept.woken
        cursors.append(swept.after)
        if (after := swept.after) is None:
            break
    assert cursors == [(a, "k1"), (a, "k3"), None]
    assert sorted((e, p, k) for e, p, k, _ in woken) == [(a, partition[a], k) for k in keys]
    # b's keys were not the walk's to move.
    assert sorted(await sweep(db)) == [(b, k) for k in keys]
    assert _seqs(await reserve(db)) == [(k, 2) for k in sorted(keys * 2)]


async def test_a_key_a_publisher_holds_does_not_stop_the_walk(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    for key in ("k1", "k2", "k1", "k2"):
        await publish(db, key)
    heads = await reserve(db)
    await complete(db, [(_unordered(r), delivered(r)) for r in heads])
    publishing = other.transaction()
    await publishing.start()
    await publish(other, "k1")

    # k1 is left for the next walk; the page after it still moves k2 on.
    swept = await store.sweep_ordering(db, ALL_PARTITIONS, None, 1)
    assert (swept.woken, swept.after) == ([], (a, "k1"))
    swept = await store.sweep_ordering(db, ALL_PARTITIONS, swept.after, 1)
    assert [(e, k) for e, _, k, _ in swept.woken] == [(a, "k2")]
    await publishing.rollback()
    assert await sweep(db) == [(a, "k1")]


def _unordered(row: asyncpg.Record) -> dict:
    """A reserved row as a worker of the release before saw it: no key."""
    return {**dict(row), "ordering_key": None}


async def _publish_racing_a_completion(db, publisher, *, isolation: str) -> asyncpg.Record:
    """The key's head completes after a publisher's snapshot was taken and
    before its publish of the key: what the publish does."""
    await publish(db, "k")
    (head,) = await reserve(db)
    tx = publisher.transaction(isolation=isolation)
    await tx.start()
    await publisher.fetchval("SELECT count(*) FROM ordering_keys")  # its snapshot
    await complete(db, [(head, delivered(head))])
    try:
        await publish(publisher, "k")
    except BaseException:
        await tx.rollback()
        raise
    await tx.commit()
    return head


async def test_a_repeatable_read_publish_racing_a_completion_fails_to_serialize(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    with pytest.raises(TransientStoreError) as failed:
        await _publish_racing_a_completion(db, other, isolation="repeatable_read")
    # serialization_failure: the publisher's transaction is to be tried
    # again, as any under repeatable read.
    assert isinstance(failed.value.__cause__, asyncpg.SerializationError)
    # Nothing of the failed publish stays, and the key is not stuck: the
    # publisher's retry is the key's head, due at once.
    row = await key_row(db, a, "k")
    assert (row["last_seq"], row["head_seq"]) == (1, None)
    again = await publish(other, "k")
    (sent,) = await reserve(db)
    assert (sent["event_id"], sent["ordering_seq"]) == (again, 2)


async def test_a_read_committed_publish_racing_a_completion_follows_it(db, other):
    a = await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    await _publish_racing_a_completion(db, other, isolation="read_committed")
    assert [(o.seq, o.state, o.due) for o in await deliveries_of(db, a, "k")] == [
        (1, "delivered", False),
        (2, "pending", True),
    ]


# One step of a run: publish to a key; a reservation round; a result for
# one of the deliveries in flight (the index taken modulo how many); the
# dead deliveries resent, or discarded.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("publish"), st.sampled_from(["k1", "k2", "k3"])),
        st.tuples(st.just("reserve"), st.just(0)),
        st.tuples(st.sampled_from(["delivered", "retry", "dead"]), st.integers(0, 3)),
        st.tuples(st.sampled_from(["resend", "discard"]), st.just(0)),
    ),
    max_size=40,
)


async def _run(conn: asyncpg.Connection, run: int, policy: str, steps: list[tuple[str, object]]) -> None:
    """Play ``steps`` on an endpoint of its own, then drain it; check at
    every round that a key has at most one delivery in flight, and that
    the numbers sent of a key only go up, but for a retry of the latest."""
    name = f"run{run}"
    # A tenant of its own: the run's events go to its endpoint only.
    endpoint = await add_endpoint(conn, name, f"http://127.0.0.1:1/{name}", tenant=name, max_concurrency=2)
    await conn.execute("UPDATE endpoints SET ordering_on_dead = $2 WHERE id = $1", endpoint, policy)
    in_flight: list[asyncpg.Record] = []
    sent: dict[str, list[tuple[int, int]]] = {}

    async def round() -> None:
        rows = await reserve(conn, endpoints=[endpoint])
        in_flight.extend(rows)
        assert {r["endpoint_id"] for r in rows} <= {endpoint}
        keys = [r["ordering_key"] for r in in_flight]
        assert len(keys) == len(set(keys)), keys
        for r in rows:
            before = sent.setdefault(r["ordering_key"], [])
            seq = (r["ordering_seq"], r["id"])
            # Higher than any before, or the latest again (its retry).
            assert not before or seq[0] > before[-1][0] or seq == before[-1], (before, seq)
            before.append(seq)

    async def settle(row: asyncpg.Record, outcome: str) -> None:
        result = {"delivered": delivered, "dead": died}.get(outcome, lambda r: retried(r, 0.0))(row)
        await complete(conn, [(row, result)])
        in_flight.remove(row)

    async def resend_dead() -> None:
        dead = [
            r["id"]
            for r in await conn.fetch(
                "SELECT id FROM deliveries WHERE endpoint_id = $1 AND state = 'dead'", endpoint
            )
        ]
        if dead:
            await resend(conn, "default", name, dead)

    for step, arg in steps:
        if step == "publish":
            await publish(conn, str(arg), tenant=name)
        elif step == "reserve":
            await round()
        elif step == "resend":
            await resend_dead()
        elif step == "discard":
            await store.discard_dead(conn, "default", name, None, "test")
        elif in_flight:
            await settle(in_flight[int(arg) % len(in_flight)], step)
    # Drained: everything delivered in the end, nothing held or outstanding.
    for row in list(in_flight):
        await settle(row, "delivered")
    await resend_dead()
    while True:
        await round()
        if not in_flight:
            break
        for row in list(in_flight):
            await settle(row, "delivered")
    states = await conn.fetch("SELECT DISTINCT state FROM deliveries WHERE endpoint_id = $1", endpoint)
    assert {r["state"] for r in states} <= {"delivered", "discarded"}
    keys = await conn.fetch("SELECT head_seq, held_since FROM ordering_keys WHERE endpoint_id = $1", endpoint)
    assert all(k["head_seq"] is None and k["held_since"] is None for k in keys)


@pytest.mark.parametrize("policy", ["hold", "skip"])
def test_any_interleaving_keeps_one_in_flight_per_key_in_order(dsn, policy):
    runs = iter(range(10**6))
    with asyncio.Runner() as runner:
        conn = runner.run(store.connect(dsn))
        try:

            @settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
            @given(steps=STEPS)
            def keeps_order(steps):
                runner.run(_run(conn, next(runs), policy, steps))

            keeps_order()
        finally:
            runner.run(conn.close())


async def _drain(db: asyncpg.Connection) -> list[tuple[str, int]]:
    """Reserve and deliver until nothing is due: each ordered delivery
    sent, as (event, number), in the order sent."""
    sent = []
    while rows := await reserve(db):
        sent += [(r["event_id"], r["ordering_seq"]) for r in rows if r["ordering_key"] is not None]
        await complete(db, [(r, delivered(r)) for r in rows])
    return sent


async def test_a_replay_sends_a_key_again_in_its_commit_order(db, other):
    await add_endpoint(db, "a", "http://127.0.0.1:1/a")
    since = await db.fetchval("SELECT now() - interval '1 minute'")
    # The transaction that began first (its transaction id is the lower)
    # commits its event of the key second.
    async with other.transaction():
        await publish(other, None)
        first = await publish(db, "k")
        late = await publish(other, "k")
    assert await _drain(db) == [(first, 1), (late, 2)]

    assert await store.replay_since(db, "default", "a", since) == 3
    # Again after the key's numbers, in the order the receiver first got
    # them: the order the publishing transactions committed.
    assert await _drain(db) == [(first, 3), (late, 4)]

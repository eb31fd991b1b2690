"""The publish function, the contract every language calls (migration 0012,
docs/publishing.md): its refusals agree with hooklane.publish's own check,
a refusal reported never costs the caller's transaction, a refusal raised
carries its SQLSTATE and argument, and the write is what publish stores."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

import asyncpg
import hypothesis
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hooklane import store
from hooklane.checks import MAX_DEPTH
from hooklane.errors import InvalidInput
from hooklane.publish import MAX_DATA_BYTES, arguments
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer

REFUSAL = "SELECT field FROM hooklane_publish_refusal_v2(%s, %s, %s::jsonb, %s, %s, %s, %s)"
TRY = "SELECT * FROM hooklane_try_publish_v1($1, $2, $3::jsonb, $4, $5, $6)"


# What the Python check and the function are both given: what a driver can
# send. A NUL or a lone surrogate cannot reach Postgres at all (the check
# refuses them, and a driver's encoding would), so they are left out here.
def _text(max_size: int) -> st.SearchStrategy[str]:
    characters = st.characters(exclude_categories=["Cs"], exclude_characters="\x00")
    return st.one_of(
        st.text(characters, max_size=max_size),
        # Around the length limits, where an off-by-one hides.
        st.integers(min_value=250, max_value=258).map(lambda n: "a" * n),
        st.sampled_from(["\x1f", "a\x7f", "\x85b", "\x9f", "\xa0", "ok", "a.b", "a.b.*", "*", "é"]),
    )


_INTEGERS = st.one_of(
    st.integers(),
    st.sampled_from([-(2**63), -(2**63) - 1, 2**64 - 1, 2**64, 2**63, -(2**64), 10**20, -(10**19)]),
)
_FLOATS = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False),
    st.sampled_from([1e16, 1.8446744073709552e19, 1e20, -9.3e18, 1.5e300, 5e-324, -0.0, 1.0, 0.5]),
)
_SCALARS = st.one_of(st.none(), st.booleans(), _INTEGERS, _FLOATS, _text(20))
_TREES = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(_text(10), inner, max_size=4)),
    max_leaves=20,
)


def _nested(depth: int) -> dict[str, Any]:
    """An object whose innermost container is ``depth`` levels down."""
    value: Any = []
    for level in range(depth, 0, -1):
        value = {"k": value} if level % 2 else [value]
    return {"top": value} if depth else value


_DATA = st.one_of(
    st.dictionaries(_text(10), _TREES, max_size=5),
    # A number at the 64-bit bounds, somewhere in the tree.
    st.one_of(_INTEGERS, _FLOATS).map(lambda n: {"n": n}),
    st.one_of(_INTEGERS, _FLOATS).map(lambda n: {"a": [{"b": [1, n]}]}),
    _TREES,
    st.integers(min_value=MAX_DEPTH - 2, max_value=MAX_DEPTH + 1).map(_nested),
    # Around the size limit, as jsonb prints it.
    st.integers(min_value=-40, max_value=40).map(lambda d: {"s": "x" * (MAX_DATA_BYTES - 9 + d)}),
    st.integers(min_value=-2, max_value=2).map(lambda d: {"s": "é" * ((MAX_DATA_BYTES - 9) // 2 + d)}),
)
_TRACEPARENTS = st.one_of(
    st.none(),
    st.from_regex(r"00-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}", fullmatch=True),
    st.sampled_from(
        [
            "00-" + "0" * 32 + "-" + "1" * 16 + "-01",
            "00-" + "1" * 32 + "-" + "0" * 16 + "-01",
            "01-" + "1" * 32 + "-" + "1" * 16 + "-01",
            "00-" + "A" * 32 + "-" + "1" * 16 + "-01",
        ]
    ),
    _text(60),
)


@pytest.fixture
async def conn(dsn: str):
    """A plain asyncpg connection, as an application has: its errors are
    the driver's, with the SQLSTATE and fields Postgres sent."""
    connection = await asyncpg.connect(dsn)
    yield connection
    await connection.close()


_RULE = re.compile(r", not |: '| at |: \d")


def python_refusal(**event: Any) -> InvalidInput | None:
    try:
        arguments(**event)
    except InvalidInput as exc:
        return exc
    return None


_ANY = {
    "tenant": st.one_of(st.none(), _text(20)),
    "type": st.one_of(
        st.from_regex(r"[A-Za-z0-9_-]{1,8}(\.[A-Za-z0-9_-]{1,8}){0,2}", fullmatch=True), _text(20)
    ),
    "data": _DATA,
    "id": st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True), _text(20)),
    "coalesce_key": st.one_of(st.none(), _text(20)),
    "traceparent": _TRACEPARENTS,
    "ordering_key": st.one_of(st.none(), _text(20)),
}
_VALID = {
    "tenant": st.sampled_from(["acme", "a" * 253, "Ünïcode tenant"]),
    "type": st.sampled_from(["order.created", "a", "x-y_z.0"]),
    "data": st.dictionaries(_text(5), st.integers(-100, 100), max_size=3),
    "id": st.sampled_from([None, "evt-1", "i" * 255]),
    "coalesce_key": st.sampled_from([None, "k", "k" * 255]),
    "traceparent": st.sampled_from([None, "00-" + "1" * 32 + "-" + "2" * 16 + "-01"]),
    "ordering_key": st.sampled_from([None, "order-7", "o" * 255]),
}


@st.composite
def _events(draw: st.DrawFn) -> dict[str, Any]:
    """Arguments of which any, often one at a time, may be wrong: so that
    every rule is reached, the data's (checked last but one) as often as
    the tenant's (checked first)."""
    # The data has four rules, each other argument one or two.
    wide = draw(st.sets(st.sampled_from([*_ANY, "data", "data", "data"]), max_size=2))
    return {name: draw(_ANY[name] if name in wide else _VALID[name]) for name in _ANY}


@settings(max_examples=500, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(event=_events())
@example(event={**dict.fromkeys(_ANY), "tenant": "acme", "type": "a", "data": {"n": 18446744073709551615}})
@example(
    event={**dict.fromkeys(_ANY), "tenant": "acme", "type": "a", "data": {"n": 1e20}, "coalesce_key": ""}
)
@example(event={**dict.fromkeys(_ANY), "tenant": "", "type": "a", "data": {}})
def test_the_function_refuses_what_the_python_check_refuses_naming_the_same_argument(postgresql, event):
    """The Python check is kept for its messages (the value quoted, the path
    in the data); the function is what every other language gets. They must
    refuse the same inputs, naming the same argument. The data goes to the
    function as the producer's JSON text, so that Python's rendering of
    what jsonb will print (its size, its integers) is checked too."""
    refusal = python_refusal(**event)
    expected = refusal and refusal.field
    # Which rule: the message up to what it quotes.
    hypothesis.event("refused: " + (_RULE.split(str(refusal))[0] if refusal else "no"))
    with postgresql.cursor() as cur:
        cur.execute(
            REFUSAL,
            (
                event["tenant"],
                event["type"],
                json.dumps(event["data"]),
                event["id"],
                event["coalesce_key"],
                event["traceparent"],
                event["ordering_key"],
            ),
        )
        (found,) = cur.fetchone()
    postgresql.rollback()
    assert found == expected


async def test_a_refusal_reported_leaves_the_callers_transaction_usable(conn: asyncpg.Connection):
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES ('o-1')")
        row = await conn.fetchrow(TRY, "acme", "order created", "{}", None, None, None)
        assert dict(row) == {
            "event_id": None,
            "stored": None,
            "fanout": None,
            "error_code": "WH422",
            "error_field": "type",
            "error_message": "must be a dotted event type like 'order.updated'",
        }
        await conn.execute("INSERT INTO orders VALUES ('o-2')")
    assert await conn.fetchval("SELECT count(*) FROM orders") == 2
    assert await conn.fetchval("SELECT count(*) FROM events") == 0


async def test_a_refusal_raised_has_its_sqlstate_and_names_the_argument(conn: asyncpg.Connection):
    with pytest.raises(asyncpg.PostgresError) as refused:
        await conn.fetchval("SELECT hooklane_publish_v1('acme', 'order.created', '[1]')")
    assert refused.value.sqlstate == "WH422"
    assert refused.value.column_name == "data"
    assert refused.value.args[0] == "data: must be a JSON object"
    # Named arguments, as the contract documents them.
    event_id = await conn.fetchval(
        "SELECT hooklane_publish_v1(tenant => 'acme', type => 'order.created', data => '{}', id => 'e-1')"
    )
    assert event_id == "e-1"
    with pytest.raises(asyncpg.PostgresError) as conflict:
        await conn.fetchval("SELECT hooklane_publish_v1('acme', 'order.created', '{\"n\": 1}', 'e-1')")
    assert (conflict.value.sqlstate, conflict.value.column_name) == ("WH409", "id")


TRY_ORDERED = "SELECT * FROM hooklane_try_publish_v3($1, $2, $3::jsonb, $4, $5, $6, $7)"
TRY_ORDERED_TEXT = "SELECT * FROM hooklane_try_publish_v4($1, $2, $3, $4, $5, $6, $7)"


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("k" * 256, "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("order\n7", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("order\x9b7", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
        ("ordre-é", "must be 1 to 255 printable ASCII characters (letters, digits, punctuation, spaces)"),
    ],
)
async def test_v3_and_v4_refuse_a_bad_ordering_key_naming_it(conn: asyncpg.Connection, key, message):
    for query in (TRY_ORDERED, TRY_ORDERED_TEXT):
        row = await conn.fetchrow(query, "acme", "order.created", "{}", "e-1", None, None, key)
        assert (row["error_code"], row["error_field"], row["error_message"]) == (
            "WH422",
            "ordering_key",
            message,
        )
    for function in ("hooklane_publish_v3", "hooklane_publish_v4"):
        with pytest.raises(asyncpg.PostgresError) as refused:
            await conn.fetchval(
                f"SELECT {function}(tenant => 'acme', type => 'order.created', data => '{{}}', ordering_key => $1)",
                key,
            )
        assert (refused.value.sqlstate, refused.value.column_name) == ("WH422", "ordering_key")
        assert refused.value.args[0] == f"ordering_key: {message}"
    assert await conn.fetchval("SELECT count(*) FROM events") == 0


async def test_v3_and_v4_store_the_ordering_key_and_refuse_another_for_the_same_id(
    db, conn: asyncpg.Connection
):
    await add_endpoint(db, "orders", "http://127.0.0.1:1/orders")
    for query, event_id in ((TRY_ORDERED, "e-1"), (TRY_ORDERED_TEXT, "e-2")):
        row = await db.fetchrow(query, "acme", "order.created", "{}", event_id, None, None, "order-7")
        assert (row["event_id"], row["stored"], row["fanout"]) == (event_id, True, 1)
    assert (
        await db.fetchval(
            "SELECT hooklane_publish_v3('acme', 'order.created', '{}', 'e-3', ordering_key => 'order-7')"
        )
        == "e-3"
    )
    rows = await db.fetch("SELECT id, ordering_key FROM events ORDER BY id")
    assert [tuple(r) for r in rows] == [("e-1", "order-7"), ("e-2", "order-7"), ("e-3", "order-7")]
    seqs = await db.fetch("SELECT event_id, ordering_seq FROM deliveries ORDER BY ordering_seq")
    assert [tuple(r) for r in seqs] == [("e-1", 1), ("e-2", 2), ("e-3", 3)]
    # The same event again is stored once; under another key it conflicts.
    again = await db.fetchrow(TRY_ORDERED, "acme", "order.created", "{}", "e-1", None, None, "order-7")
    assert (again["stored"], again["error_code"]) == (False, None)
    other = await db.fetchrow(TRY_ORDERED_TEXT, "acme", "order.created", "{}", "e-1", None, None, "order-8")
    assert (other["error_code"], other["error_field"]) == ("WH409", "id")
    with pytest.raises(asyncpg.PostgresError) as conflict:
        await conn.fetchval("SELECT hooklane_publish_v4('acme', 'order.created', '{}', 'e-2')")
    assert (conflict.value.sqlstate, conflict.value.column_name) == ("WH409", "id")
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 3


async def test_a_refusal_raised_inside_a_savepoint_costs_only_the_savepoint(conn: asyncpg.Connection):
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES ('o-1')")
        with pytest.raises(asyncpg.PostgresError):
            async with conn.transaction():
                await conn.fetchval("SELECT hooklane_publish_v1('acme', 'order.created', '{}', 'bad id')")
        await conn.fetchval("SELECT hooklane_publish_v1('acme', 'order.created', '{}', 'good-id')")
    assert await conn.fetchval("SELECT count(*) FROM orders") == 1
    assert await conn.fetch("SELECT id FROM events") == [("good-id",)]


async def test_the_function_stores_counts_fans_out_coalesces_and_is_idempotent(
    db: asyncpg.Connection, receiver
):
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)), event_types=["order.*"])
    await add_endpoint(db, "all", receiver.on("all", Answer(204)))
    made = await db.fetchrow(TRY, "acme", "order.created", '{"n": 1}', None, "k", None)
    assert re.fullmatch(r"msg_[0-9a-f]{32}", made["event_id"]) and made["stored"] and made["fanout"] == 2
    # The same key replaces the pending delivery to each endpoint.
    again = await db.fetchrow(TRY, "acme", "order.updated", '{"n": 2}', "e-2", "k", None)
    assert (again["event_id"], again["stored"], again["fanout"]) == ("e-2", True, 2)
    assert await db.fetchval("SELECT count(*) FROM deliveries WHERE event_id = 'e-2'") == 2
    assert await db.fetchval("SELECT count(*) FROM deliveries") == 2
    # The same event again: nothing more.
    repeat = await db.fetchrow(TRY, "acme", "order.updated", '{"n": 2}', "e-2", "k", None)
    assert (repeat["event_id"], repeat["stored"], repeat["fanout"], repeat["error_code"]) == (
        "e-2",
        False,
        None,
        None,
    )
    # Unrouted: kept, with its fan-out of 0.
    unrouted = await db.fetchrow(TRY, "globex", "order.created", "{}", "e-3", None, None)
    assert (unrouted["stored"], unrouted["fanout"]) == (True, 0)
    assert await db.fetchval("SELECT fanout FROM events WHERE id = 'e-3'") == 0


async def test_an_id_committed_by_another_transaction_while_waiting_is_compared(db, dsn):
    """The second publisher's insert waits on the first's uncommitted row;
    once that commits, the function compares with it (a fresh snapshot),
    so other content under the id is a conflict, not a silent drop."""
    other, watch = await asyncpg.connect(dsn), await asyncpg.connect(dsn)
    try:
        holder = other.transaction()
        await holder.start()
        await other.fetchrow(TRY, "acme", "order.created", '{"n": 1}', "e-1", None, None)
        waiting = asyncio.ensure_future(
            db.fetchrow(TRY, "acme", "order.created", '{"n": 2}', "e-1", None, None)
        )
        pid = db.get_server_pid()
        await wait_for(
            lambda: watch.fetchval(
                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = $1", pid
            )
        )
        assert not waiting.done()
        await holder.commit()
        row = await waiting
        assert (row["error_code"], row["error_field"]) == ("WH409", "id")
    finally:
        await other.close()
        await watch.close()


@pytest.fixture
async def application_role(conn: asyncpg.Connection, dsn: str):
    """A login role of the application's own, holding nothing of Hooklane's
    but what the test grants it; dropped afterwards (roles are the whole
    server's)."""
    role = f"app_{uuid.uuid4().hex[:12]}"
    await conn.execute(f"CREATE ROLE {role} LOGIN")
    await conn.execute(f"GRANT CREATE ON SCHEMA public TO {role}")
    try:
        yield role, dsn.replace("postgresql://postgres@", f"postgresql://{role}@")
    finally:
        await conn.execute(f"DROP OWNED BY {role}")
        await conn.execute(f"DROP ROLE {role}")


async def test_publishing_is_granted_and_needs_nothing_on_the_tables(conn, application_role, receiver):
    role, app_dsn = application_role
    await add_endpoint(conn, "orders", receiver.on("orders", Answer(204)))
    app = await asyncpg.connect(app_dsn)
    try:
        await app.execute("CREATE TABLE orders (id text PRIMARY KEY)")
        # Not granted: refused, as any statement without the privilege.
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.fetchrow(TRY, "acme", "order.created", "{}", "e-1", None, None)
        await conn.execute(
            f"GRANT EXECUTE ON FUNCTION hooklane_try_publish_v1, hooklane_publish_v1 TO {role}"
        )
        # EXECUTE alone names no tenant: refused, before anything is read.
        row = await app.fetchrow(TRY, "acme", "order.created", "{}", "e-1", None, None)
        assert (row["error_code"], row["error_field"]) == ("WH403", "tenant")
        await store.grant_publisher(conn, role, ["acme"])
        # A table of the caller's named like Hooklane's is not the one written.
        await app.execute("CREATE TEMPORARY TABLE events (id text, tenant text)")
        async with app.transaction():
            await app.execute("INSERT INTO orders VALUES ('o-1')")
            row = await app.fetchrow(TRY, "acme", "order.created", "{}", "e-1", None, None)
            assert (row["event_id"], row["stored"], row["fanout"]) == ("e-1", True, 1)
            assert (
                await app.fetchval("SELECT hooklane_publish_v1('acme', 'order.created', '{}', 'e-2')")
                == "e-2"
            )
        with pytest.raises(asyncpg.InsufficientPrivilegeError):
            await app.fetch("SELECT * FROM deliveries")
        assert await app.fetchval("SELECT count(*) FROM pg_temp.events") == 0
    finally:
        await app.close()
    assert await conn.fetchval("SELECT count(*) FROM deliveries") == 2


def deep_json(kind: str, depth: int) -> str:
    """A JSON object holding ``depth`` containers nested, itself the first:
    objects all the way down, or arrays under the top object. 64 is the
    most a publish takes (the innermost at level 63)."""
    if kind == "object":
        return '{"k": ' * depth + "1" + "}" * depth
    return '{"a": ' + "[" * (depth - 1) + "1" + "]" * (depth - 1) + "}"


TRY_TEXT = "SELECT * FROM hooklane_try_publish_v2($1, $2, $3, $4, $5, $6)"
DEEPER = "nests deeper than 64 levels"


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("depth", [64, 65, 10_000, 20_000])
async def test_deep_data_is_answered_in_the_row_and_the_callers_row_is_kept(conn, kind, depth):
    """Any depth, as JSON text (v2): PostgreSQL's own parser overflows its
    stack at ~14,000 levels, inside the function's parse."""
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES ('o-1')")
        row = await conn.fetchrow(
            TRY_TEXT, "acme", "order.created", deep_json(kind, depth), "e-1", None, None
        )
    assert await conn.fetchval("SELECT count(*) FROM orders") == 1
    if depth == 64:
        assert (row["event_id"], row["stored"], row["error_code"]) == ("e-1", True, None)
    else:
        assert (row["error_code"], row["error_field"], row["error_message"]) == ("WH422", "data", DEEPER)
        assert await conn.fetchval("SELECT count(*) FROM events") == 0


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("depth", [64, 65, 10_000, 12_000])
async def test_deep_jsonb_is_answered_in_the_row_up_to_what_the_callers_cast_parses(conn, kind, depth):
    """v1 takes jsonb, which the caller's statement parses: what parses
    is answered, where the depth rule overflowed at ~11,000 levels."""
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    async with conn.transaction():
        await conn.execute("INSERT INTO orders VALUES ('o-1')")
        row = await conn.fetchrow(TRY, "acme", "order.created", deep_json(kind, depth), "e-1", None, None)
    assert await conn.fetchval("SELECT count(*) FROM orders") == 1
    expected = (None, None) if depth == 64 else ("WH422", DEEPER)
    assert (row["error_code"], row["error_message"]) == expected


@pytest.mark.parametrize(
    ("data", "message"),
    [
        # 81 KB of numbers of 131,072 digits each: 1.2 GB printed.
        ('{"a": [' + "1e131071," * 9000 + "1]}", "has an integer outside the 64-bit range"),
        # 630 KB of numbers of 16,385 characters each: 1.1 GB printed.
        ('{"a": [' + "1e-16383," * 70_000 + "1]}", "is larger than 262144 bytes"),
        ('{"a": [' + "0e-16383," * 70_000 + "1]}", "is larger than 262144 bytes"),
        # Many zeros that print short: within the limit.
        ('{"a": [' + "0," * 87_000 + "1]}", None),
        # A binary too large to print within the limit.
        ('{"a": [' + "1," * 300_000 + "1]}", "is larger than 262144 bytes"),
    ],
    ids=["huge integers", "tiny numbers", "zeros with a scale", "zeros", "large binary"],
)
async def test_numbers_that_print_long_are_refused_in_the_row(conn, data, message):
    """Each was an out-of-memory error that aborted the caller's
    transaction: the function printed the whole data first."""
    await conn.execute("CREATE TABLE orders (id text PRIMARY KEY)")
    for query in (TRY, TRY_TEXT):
        async with conn.transaction():
            await conn.execute("INSERT INTO orders VALUES ('o-1')")
            row = await conn.fetchrow(query, "acme", "order.created", data, None, None, None)
            assert row["error_message"] == message
            await conn.execute("DELETE FROM orders")


@pytest.mark.parametrize(
    ("data", "message"),
    [
        ("{", "is not JSON that PostgreSQL can store: invalid input syntax for type json"),
        ('{"a": "\\u0000"}', "is not JSON that PostgreSQL can store: unsupported Unicode escape sequence"),
        ('{"a": 1e131072}', "is not JSON that PostgreSQL can store: value overflows numeric format"),
        (" " * (4 * 1024 * 1024 + 1), "is more than 4194304 bytes of JSON text"),
    ],
)
async def test_text_that_jsonb_cannot_hold_is_refused_in_the_row(conn, data, message):
    async with conn.transaction():
        row = await conn.fetchrow(TRY_TEXT, "acme", "order.created", data, None, None, None)
        assert (row["error_code"], row["error_field"]) == ("WH422", "data")
        assert row["error_message"].startswith(message), row["error_message"]
        # The transaction goes on.
        assert await conn.fetchval("SELECT 1") == 1
    # The arguments before the data still come first.
    row = await conn.fetchrow(TRY_TEXT, "acme", "order created", "{", None, None, None)
    assert row["error_field"] == "type"
    with pytest.raises(asyncpg.PostgresError) as refused:
        await conn.fetchval("SELECT hooklane_publish_v2('acme', 'order.created', '{')")
    assert (refused.value.sqlstate, refused.value.column_name) == ("WH422", "data")

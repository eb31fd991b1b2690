"""``hooklane.jsonb.jsonb_text`` against Postgres itself: it prints data
as ``jsonb::text`` does, floats that overflow included (issue 18, item 1)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hooklane.errors import InvalidInput
from hooklane.jsonb import jsonb_text, number_text
from hooklane.publish import MAX_DATA_BYTES, check_event

# What Postgres can store: no NUL, no lone surrogate. Controls, DEL, C1,
# line separators and characters of every UTF-8 length are in.
TEXT = st.text(
    st.one_of(
        st.characters(blacklist_categories=["Cs"], blacklist_characters="\x00"),
        st.sampled_from(["\x01", "\x1f", "\x7f", "\x85", "\u2028", "\ufeff", '"', "\\", "/", "é", "😀"]),
    ),
    max_size=12,
)


KEYS = st.one_of(TEXT, st.sampled_from(["a", "b", "aa", "ab", "B", "é", "zz", "ÿ", "😀", "id"]))


EDGE_FLOATS = [
    0.0,
    -0.0,
    1.0,
    -1.0,
    0.1,
    100.0,
    1e-4,
    1e-5,
    1e-7,
    1.5e-10,
    5e-324,
    -5e-324,
    2.2250738585072014e-308,
    9.999999999999998e15,
    1e15,
    1e16,
    -1e16,
    1.2345e17,
    1e19,
    18446744073709549568.0,
    -9.223372036854775e18,
]


FLOATS = st.one_of(
    st.sampled_from(EDGE_FLOATS),
    st.floats(min_value=-9.2e18, max_value=1.8e19),
    st.floats(min_value=-1e-290, max_value=1e-290),
)


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.integers(min_value=-1000, max_value=1000),
    FLOATS,
    TEXT,
)


VALUES = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=5), st.dictionaries(KEYS, children, max_size=5)),
    max_leaves=30,
)


OBJECTS = st.dictionaries(KEYS, VALUES, max_size=6)


def _on_postgres(dsn: str, check) -> None:
    """Run the hypothesis test ``check(conn, runner)`` on one connection."""
    with asyncio.Runner() as runner:
        conn = runner.run(asyncpg.connect(dsn))
        try:
            check(conn, runner)
        finally:
            runner.run(conn.close())


async def _printed(conn: asyncpg.Connection, text: str) -> str:
    return await conn.fetchval("SELECT $1::jsonb::text", text)


def test_jsonb_text_is_what_postgres_prints(dsn):
    def check(conn, runner):
        @settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(data=OBJECTS)
        def prints_alike(data):
            text = jsonb_text(data)
            # What a producer's JSON becomes, and what the stored text
            # becomes when it is stored and read back again.
            assert runner.run(_printed(conn, json.dumps(data, ensure_ascii=False))) == text
            assert runner.run(_printed(conn, text)) == text
            # What check_event accepts, it measures on this very text.
            assert check_event(tenant="acme", type="order.created", data=data) == text
            assert len(text.encode()) <= MAX_DATA_BYTES

        prints_alike()

    _on_postgres(dsn, check)


def test_a_float_is_refused_exactly_when_jsonb_makes_it_a_64_bit_overflow(dsn):
    def check(conn, runner):
        @settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(x=st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from(EDGE_FLOATS)))
        def refused_iff_out_of_range(x):
            printed = runner.run(_printed(conn, json.dumps([x])))
            assert printed == f"[{number_text(x)}]"
            stored_integer = "." not in printed
            out_of_range = stored_integer and not -(2**63) <= int(printed[1:-1]) <= 2**64 - 1
            try:
                check_event(tenant="acme", type="t", data={"x": x})
            except InvalidInput as exc:
                assert out_of_range and exc.field == "data" and "data.x" in exc.message
                assert len(str(exc)) < 300
            else:
                assert not out_of_range

        refused_iff_out_of_range()

    _on_postgres(dsn, check)


async def test_edge_cases_print_as_postgres_prints_them(db):
    cases: list[Any] = [
        {"floats": EDGE_FLOATS},
        {"bb": 1, "a": 2, "é": 3, "z": 4, "ab": 5, "B": 6, "\uffff": 7, "😀": 8, "aaa": 9, "": 10},
        {"s": '\x01\x1f\x7f\x80\u2028"\\/\b\f\n\r\t é 😀'},
        {"empty": [[], {}, ""], "t": (1, (2,)), "n": None, "b": [True, False]},
        {"ints": [0, -1, 2**63 - 1, -(2**63), 2**64 - 1]},
    ]
    for data in cases:
        assert await _printed(db, json.dumps(data, ensure_ascii=False)) == jsonb_text(data)

"""``hooklane.jsonb.jsonb_text`` prints data as Postgres's ``jsonb::text``
does, and ``check_event`` measures that text: what a receiver gets is what
was checked, byte for byte (issue 18, item 1)."""

from __future__ import annotations

import asyncio
import json
from collections import OrderedDict
from enum import IntEnum
from typing import Any

import asyncpg
import pytest
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


@pytest.mark.db
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


@pytest.mark.db
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


@pytest.mark.db
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


def test_subclasses_print_as_json_reads_them():
    class Level(IntEnum):
        HIGH = 3

    class Name(str):
        def __str__(self) -> str:
            return "not this"

    data = {"level": Level.HIGH, "name": Name("x"), "o": OrderedDict([("bb", 1), ("a", 2)])}
    assert jsonb_text(data) == '{"o": {"a": 2, "bb": 1}, "name": "x", "level": 3}'


def _padded(shape: Any, size: int) -> dict[str, Any]:
    """``{"v": shape, "pad": "xx…"}`` whose jsonb text is ``size`` bytes."""
    data = {"v": shape, "pad": ""}
    data["pad"] = "x" * (size - len(jsonb_text(data).encode()))
    return data


# Shapes that are small as compact JSON or as the early bound counts them,
# and large as jsonb prints them.
SHAPES = {
    "zeros": [0] * 80_000,
    "tiny floats": [5e-324] * 790,
    "short keys": {f"{i:x}": [] for i in range(20_000)},
    "controls": ["\x01" * 6] * 6_000,
    "non-ascii": ["é😀"] * 20_000,
    "empty containers": [[{}], []] * 20_000,
}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_the_limit_is_measured_on_the_text_sent(shape):
    at_limit = _padded(shape, MAX_DATA_BYTES)
    assert len(check_event(tenant="a", type="t", data=at_limit).encode()) == MAX_DATA_BYTES
    with pytest.raises(InvalidInput) as refused:
        check_event(tenant="a", type="t", data=_padded(shape, MAX_DATA_BYTES + 1))
    assert refused.value.field == "data" and "larger than" in refused.value.message


def test_many_tiny_floats_under_the_limit_as_written_are_refused():
    # 7 bytes each as the producer wrote them, 326 as jsonb prints them: 12 MB.
    data = {"readings": [5e-324] * 37_000}
    assert len(json.dumps(data, separators=(",", ":")).encode()) < MAX_DATA_BYTES
    with pytest.raises(InvalidInput) as refused:
        check_event(tenant="a", type="t", data=data)
    assert refused.value.field == "data" and "larger than" in refused.value.message

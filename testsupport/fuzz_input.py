"""What tests/db/test_fuzz_input.py and tests/unit/test_fuzz_input.py share."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from hooklane.checks import EVENT_TYPE

# Text with what breaks storage or terminals mixed in: NUL, lone surrogates,
# newlines and other controls.
NASTY = st.sampled_from(
    ["\x00", "\ud800", "\udfff", "\n", "\r", "\t", "\x1b", "\x7f", "\x85", "\u2028", "\ufeff"]
)


TEXT = st.text(st.one_of(st.characters(), NASTY), max_size=20)


SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(),
    TEXT,
)


KEYS = st.one_of(TEXT, st.sampled_from(["url", "tenant", "name", "spec", "secretRef", "key"]))


JSON_LIKE = st.recursive(
    SCALARS,
    lambda children: st.one_of(st.lists(children, max_size=4), st.dictionaries(KEYS, children, max_size=4)),
    max_leaves=20,
)


ODD_KEYS = st.dictionaries(
    st.one_of(st.integers(), st.none(), st.booleans()), JSON_LIKE, min_size=1, max_size=2
)


def nest(levels: int) -> Any:
    value: Any = "x"
    for i in range(levels):
        value = {"a": value} if i % 2 else [value]
    return value


DEEP = st.integers(min_value=60, max_value=300).map(nest)


ANYTHING = st.one_of(JSON_LIKE, ODD_KEYS, DEEP)


def mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` seven times in eight, anything else otherwise: most examples
    then get past the first check, and reach the next ones."""
    return st.integers(0, 7).flatmap(lambda n: good if n else ANYTHING)


PRINTABLE = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), min_size=1, max_size=20
)


EVENTS = st.fixed_dictionaries(
    {
        "tenant": mostly(PRINTABLE),
        "type": mostly(st.from_regex(EVENT_TYPE, fullmatch=True)),
        "data": mostly(st.dictionaries(KEYS, JSON_LIKE, max_size=5)),
    },
    optional={
        "id": mostly(st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True))),
        "coalesce_key": mostly(st.one_of(st.none(), PRINTABLE)),
    },
)


def numbers_as_floats(value: Any) -> Any:
    """jsonb keeps numbers as numeric: 1e300 comes back as 1000...0."""
    if isinstance(value, dict):
        return {k: numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [numbers_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value

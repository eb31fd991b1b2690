"""Property tests: whatever the input, the answer is a result or
``InvalidInput``, never another exception; and what ``check_event`` accepts,
Postgres stores."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import asyncpg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import hooklane
from hooklane.checks import EVENT_TYPE
from hooklane.errors import InvalidInput
from hooklane.publish import check_event
from hooklane.spec import API_VERSION, KIND, load_manifest, parse_manifest

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


def _nest(levels: int) -> Any:
    value: Any = "x"
    for i in range(levels):
        value = {"a": value} if i % 2 else [value]
    return value


DEEP = st.integers(min_value=60, max_value=300).map(_nest)
ANYTHING = st.one_of(JSON_LIKE, ODD_KEYS, DEEP)


def _mostly(good: st.SearchStrategy) -> st.SearchStrategy:
    """``good`` seven times in eight, anything else otherwise: most examples
    then get past the first check, and reach the next ones."""
    return st.integers(0, 7).flatmap(lambda n: good if n else ANYTHING)


PRINTABLE = st.text(
    st.characters(codec="utf-8", categories=["L", "N", "P", "S", "Zs"]), min_size=1, max_size=20
)
NAMES = st.from_regex(r"[a-z0-9]([-a-z0-9]{0,10}[a-z0-9])?", fullmatch=True)
URLS = st.builds(
    lambda scheme, host, port, path: f"{scheme}://{host}{port}{path}",
    st.sampled_from(["http", "https", "HTTPS", "ftp"]),
    st.one_of(
        st.from_regex(r"[a-z0-9]([-a-z0-9]{0,5}[a-z0-9])?(\.[a-z]{2,5}){0,2}\.?", fullmatch=True),
        st.ip_addresses(v=4).map(str),
        st.ip_addresses(v=6).map(lambda ip: f"[{ip}]"),
        st.from_regex(r"[a-z0-9.\-\[\]:_%@x]{0,20}", fullmatch=True),
        TEXT,
    ),
    st.one_of(
        st.just(""),
        st.integers(0, 70000).map(lambda p: f":{p}"),
        st.from_regex(r":[0-9a-z+ ]{0,7}", fullmatch=True),
    ),
    st.one_of(st.just("/"), PRINTABLE.map(lambda t: "/" + t), TEXT.map(lambda t: "/" + t)),
)
SPECS = st.fixed_dictionaries(
    {"url": _mostly(URLS), "tenant": _mostly(PRINTABLE)},
    optional={
        "secretRef": _mostly(
            st.fixed_dictionaries(
                {
                    "name": _mostly(NAMES),
                    "key": _mostly(st.from_regex(r"[-._a-zA-Z0-9]{1,10}", fullmatch=True)),
                }
            )
        ),
        "maxConcurrency": _mostly(st.integers(min_value=-2, max_value=300)),
        "eventTypes": _mostly(
            st.lists(st.one_of(st.from_regex(EVENT_TYPE, fullmatch=True), TEXT), max_size=3)
        ),
        "timeoutSeconds": _mostly(st.integers(min_value=-2, max_value=70)),
        "paused": _mostly(st.booleans()),
    },
)
MANIFESTS = st.fixed_dictionaries(
    {
        "apiVersion": _mostly(st.just(API_VERSION)),
        "kind": _mostly(st.just(KIND)),
        "metadata": _mostly(
            st.fixed_dictionaries(
                {"name": _mostly(NAMES)},
                optional={"namespace": _mostly(NAMES), "labels": _mostly(st.dictionaries(NAMES, PRINTABLE))},
            )
        ),
        "spec": _mostly(SPECS),
    },
    optional={"status": _mostly(st.fixed_dictionaries({"phase": PRINTABLE}))},
)


def _parses_or_refuses(parse, value) -> None:
    try:
        parse(value)
    except InvalidInput as exc:
        # Messages stay short whatever the input held.
        assert len(str(exc)) < 1000


@settings(max_examples=300, deadline=None)
@given(doc=st.one_of(JSON_LIKE, ODD_KEYS, DEEP, MANIFESTS))
def test_parse_manifest_accepts_or_refuses_anything(doc):
    _parses_or_refuses(parse_manifest, doc)


YAML_ALPHABET = st.sampled_from(
    [*list("[]{}:,-&*!|>'\"#%@`?.\\ \t\n0123456789abcdefxyz_"), "\x00", "ÿ", "\u2028"]
)


@settings(max_examples=300, deadline=None)
@given(
    raw=st.one_of(
        st.binary(max_size=200),
        st.text(YAML_ALPHABET, max_size=200).map(str.encode),
        MANIFESTS.map(lambda doc: json.dumps(doc, ensure_ascii=False).encode("utf-8", "surrogatepass")),
    )
)
def test_load_manifest_accepts_or_refuses_any_bytes(raw):
    _parses_or_refuses(lambda r: load_manifest(r, "--filename"), raw)


EVENTS = st.fixed_dictionaries(
    {
        "tenant": _mostly(PRINTABLE),
        "type": _mostly(st.from_regex(EVENT_TYPE, fullmatch=True)),
        "data": _mostly(st.dictionaries(KEYS, JSON_LIKE, max_size=5)),
    },
    optional={
        "id": _mostly(st.one_of(st.none(), st.from_regex(r"[A-Za-z0-9_.:-]{1,20}", fullmatch=True))),
        "coalesce_key": _mostly(st.one_of(st.none(), PRINTABLE)),
    },
)


@settings(max_examples=500, deadline=None)
@given(event=EVENTS)
def test_check_event_accepts_or_refuses_anything(event):
    try:
        data_json = check_event(**event)
    except InvalidInput as exc:
        assert len(str(exc)) < 1000
        return
    assert _numbers_as_floats(json.loads(data_json)) == _numbers_as_floats(event["data"])
    # What Postgres stores: UTF-8 text, and no NUL even escaped.
    assert data_json.encode("utf-8") and "\\u0000" not in data_json


def _numbers_as_floats(value: Any) -> Any:
    """jsonb keeps numbers as numeric: 1e300 comes back as 1000...0."""
    if isinstance(value, dict):
        return {k: _numbers_as_floats(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_numbers_as_floats(v) for v in value]
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    return value


async def _publish_or_refuse(conn: asyncpg.Connection, event: dict[str, Any]) -> None:
    async with conn.transaction():
        await conn.execute("INSERT INTO fuzz_marker VALUES (1)")
        try:
            event_id = await hooklane.publish(conn, **event)
        except InvalidInput:
            assert await conn.fetchval("SELECT count(*) FROM events") == 0
        else:
            stored = await conn.fetchval("SELECT data::text FROM events WHERE id = $1", event_id)
            assert _numbers_as_floats(json.loads(stored)) == _numbers_as_floats(event["data"])
        # The caller's transaction goes on either way.
        assert await conn.fetchval("SELECT count(*) FROM fuzz_marker") >= 1
        await conn.execute("DELETE FROM events")


@pytest.mark.db
def test_publish_stores_what_check_event_accepts(dsn):
    with asyncio.Runner() as runner:
        conn = runner.run(asyncpg.connect(dsn))
        runner.run(conn.execute("CREATE TABLE fuzz_marker (n int)"))

        @settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
        @given(event=EVENTS)
        def publish_or_refuse(event):
            runner.run(_publish_or_refuse(conn, event))

        try:
            publish_or_refuse()
            assert runner.run(conn.fetchval("SELECT count(*) FROM fuzz_marker")) > 0
        finally:
            runner.run(conn.close())

"""Property tests: whatever the input, the answer is a result or
``InvalidInput``, never another exception. That what ``check_event``
accepts Postgres stores is tests/db/test_fuzz_input.py's."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from hooklane.checks import EVENT_TYPE
from hooklane.errors import InvalidInput
from hooklane.publish import check_event
from hooklane.spec import API_VERSION, KIND, load_manifest, parse_manifest
from testsupport.fuzz_input import (
    DEEP,
    EVENTS,
    JSON_LIKE,
    ODD_KEYS,
    PRINTABLE,
    TEXT,
    mostly,
    numbers_as_floats,
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
    {"url": mostly(URLS), "tenant": mostly(PRINTABLE)},
    optional={
        "secretRef": mostly(
            st.fixed_dictionaries(
                {
                    "name": mostly(NAMES),
                    "key": mostly(st.from_regex(r"[-._a-zA-Z0-9]{1,10}", fullmatch=True)),
                }
            )
        ),
        "maxConcurrency": mostly(st.integers(min_value=-2, max_value=300)),
        "eventTypes": mostly(
            st.lists(st.one_of(st.from_regex(EVENT_TYPE, fullmatch=True), TEXT), max_size=3)
        ),
        "timeoutSeconds": mostly(st.integers(min_value=-2, max_value=70)),
        "paused": mostly(st.booleans()),
    },
)
MANIFESTS = st.fixed_dictionaries(
    {
        "apiVersion": mostly(st.just(API_VERSION)),
        "kind": mostly(st.just(KIND)),
        "metadata": mostly(
            st.fixed_dictionaries(
                {"name": mostly(NAMES)},
                optional={"namespace": mostly(NAMES), "labels": mostly(st.dictionaries(NAMES, PRINTABLE))},
            )
        ),
        "spec": mostly(SPECS),
    },
    optional={"status": mostly(st.fixed_dictionaries({"phase": PRINTABLE}))},
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


@settings(max_examples=500, deadline=None)
@given(event=EVENTS)
def test_check_event_accepts_or_refuses_anything(event):
    try:
        data_json = check_event(**event)
    except InvalidInput as exc:
        assert len(str(exc)) < 1000
        return
    assert numbers_as_floats(json.loads(data_json)) == numbers_as_floats(event["data"])
    # What Postgres stores: UTF-8 text, and no NUL even escaped.
    assert data_json.encode("utf-8") and "\\u0000" not in data_json

"""Page cursors and times as callers hand them in: what comes back out of a
listing is taken again, anything else is refused by name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane.checks import EVENT_TYPE
from hooklane.errors import InvalidInput
from hooklane.publish import _ID as PUBLISHED_ID
from hooklane.store.cursor import (
    EVENT_ID,
    EndpointPosition,
    HeldKeyPosition,
    catalogue_cursor,
    catalogue_position,
    delivery_cursor,
    delivery_position,
    endpoint_cursor,
    endpoint_position,
    event_cursor,
    event_position,
    held_key_cursor,
    held_key_position,
)
from hooklane.times import parse_time, rfc3339


@given(st.integers(0, 2**64 - 1), st.just("") | st.from_regex(EVENT_ID, fullmatch=True))
def test_an_event_cursor_comes_back_as_it_went(xact, event_id):
    cursor = event_cursor(xact, event_id)
    assert cursor.isascii() and "=" not in cursor
    assert event_position(cursor) == (xact, event_id)


def test_a_cursor_names_events_by_the_rule_of_event_ids():
    assert EVENT_ID.pattern == PUBLISHED_ID.pattern


@pytest.mark.parametrize("event_id", ["a\x00b", "\x00", "café", "a b", "x" * 256, "a\n"])
def test_a_cursor_holding_what_no_event_id_can_be_is_refused(event_id):
    # A NUL reached Postgres, which refused it with a data exception: 503.
    with pytest.raises(InvalidInput) as refused:
        event_position(event_cursor(7, event_id), "--cursor")
    assert refused.value.field == "--cursor"


@given(st.integers(1, 2**63 - 1))
def test_a_delivery_cursor_comes_back_as_it_went(delivery_id):
    assert delivery_position(delivery_cursor(delivery_id)) == delivery_id


@pytest.mark.parametrize(
    "cursor",
    ["", "!!", "bm9wZQ", delivery_cursor(5), event_cursor(1, "x")[:-1] + "%", "x" * 2000],
)
def test_a_cursor_from_elsewhere_is_refused(cursor):
    with pytest.raises(InvalidInput) as refused:
        event_position(cursor)
    assert refused.value.field == "cursor"
    with pytest.raises(InvalidInput):
        delivery_position(event_cursor(5, "x"))


def test_no_cursor_is_the_first_page():
    assert event_position(None) == (0, "")
    assert delivery_position(None) is None


def test_times_need_a_timezone():
    assert parse_time("2026-03-01T12:00:00Z", "since") == datetime(2026, 3, 1, 12, tzinfo=UTC)
    plus_two = parse_time("2026-03-01T14:00:00+02:00", "since")
    assert plus_two == datetime(2026, 3, 1, 12, tzinfo=UTC) and plus_two.utcoffset() == timedelta(0)
    assert rfc3339(plus_two) == "2026-03-01T12:00:00Z"
    assert rfc3339(datetime(2026, 3, 1, 12, 0, 0, 5, tzinfo=timezone(timedelta(hours=1)))) == (
        "2026-03-01T11:00:00.000005Z"
    )
    for text, words in (
        ("2026-03-01T12:00:00", "needs a timezone"),
        ("2026-03-01", "needs a timezone"),
        ("yesterday", "must be an RFC 3339 time"),
        ("2026-03-01T12:00:00Z" + " " * 100, "must be an RFC 3339 time"),
        # Accepted by fromisoformat, but beyond datetime's range in UTC.
        ("0001-01-01T00:00:00+14:00", "outside the years 1 to 9999"),
        ("9999-12-31T23:59:59-14:00", "outside the years 1 to 9999"),
    ):
        with pytest.raises(InvalidInput) as refused:
            parse_time(text, "until")
        assert refused.value.field == "until" and words in refused.value.message


@given(
    st.none() | st.datetimes(timezones=st.just(UTC)),
    st.from_regex(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?", fullmatch=True),
    st.from_regex(r"[a-z0-9]([-a-z0-9.]{0,100}[a-z0-9])?", fullmatch=True),
)
def test_an_endpoint_cursor_comes_back_as_the_position_it_was(at, namespace, name):
    position = EndpointPosition(at, namespace, name)
    assert endpoint_position(endpoint_cursor(position)) == position


@pytest.mark.parametrize(
    "text",
    ["n1::default", "n1:x:default:a", "n2::default:a", "n1::Default:a", "n1::default:a:b", "d1:5", ""],
)
def test_what_no_endpoint_listing_returned_is_refused(text):
    with pytest.raises(InvalidInput) as refused:
        endpoint_position(_encode_text(text) or "=")
    assert refused.value.field == "cursor"


def test_an_endpoint_cursor_past_any_time_is_refused():
    with pytest.raises(InvalidInput):
        endpoint_position(_encode_text(f"n1:{10**19 - 1}:default:a"))


def _encode_text(text: str) -> str:
    import base64

    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


@given(st.from_regex(EVENT_TYPE, fullmatch=True))
def test_a_catalogue_cursor_comes_back_as_the_name_it_was(name):
    assert catalogue_position(catalogue_cursor(name)) == name


@pytest.mark.parametrize("text", ["t1:", "t1:a..b", "t1:a:b", "n1::default:orders", "t1:order.*"])
def test_what_no_catalogue_listing_returned_is_refused(text):
    with pytest.raises(InvalidInput, match="cursor: is not a cursor this listing returned"):
        catalogue_position(_encode_text(text))
    assert catalogue_position(None) is None


# Every ordering key publish takes (hooklane_publish_refusal_v2): 1 to 255
# characters, none a control character.
# What hooklane_publish_refusal_v2 lets through: printable ASCII.
_ORDERING_KEY = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), min_size=1, max_size=255)


@given(
    st.datetimes(datetime(1970, 1, 1), datetime(2200, 1, 1), timezones=st.just(UTC)),
    _ORDERING_KEY | st.just("~" * 255),
)
def test_a_held_key_cursor_gives_back_its_position(at, key):
    position = HeldKeyPosition(at, key)
    assert held_key_position(held_key_cursor(position)) == position


@pytest.mark.parametrize("key", ["", "a\nb", "a\x9fb", "k" * 256, "ключ"])
def test_a_held_key_cursor_of_no_key_publish_takes_is_refused(key):
    with pytest.raises(InvalidInput) as refused:
        held_key_position(held_key_cursor(HeldKeyPosition(datetime(2026, 1, 1, tzinfo=UTC), key)))
    assert refused.value.field == "cursor"

"""The pure parts of the delivery pages (hooklane/api/pages.py): the
payload pretty-printed token by token and cut, the headers shown without
secrets, and the event types page's number. Over HTTP:
tests/db/test_delivery_pages.py."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane.api import dashboard
from hooklane.api.pages import HIDDEN, pretty_json, sent_headers, shown_payload
from hooklane.delivery import RequestTerms
from hooklane.errors import InvalidInput
from hooklane.jsonb import jsonb_text
from hooklane.signing import event_body
from hooklane.store import SentRequest

_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)


def _outside_strings(text: str) -> str:
    """``text`` without the whitespace between its tokens."""
    return "".join(m[0] for m in re.finditer(r'"(?:[^"\\]|\\.)*"|[^\s"]+', text))


@given(_JSON)
def test_pretty_printing_keeps_every_token_as_it_was(value: object) -> None:
    body = event_body("e1", "t", datetime(2026, 3, 1, tzinfo=UTC), jsonb_text({"v": value})).decode()
    pretty = pretty_json(body)
    assert json.loads(pretty) == json.loads(body)
    assert _outside_strings(pretty) == _outside_strings(body)


def test_numbers_and_escapes_are_not_printed_again() -> None:
    text = '{"n": 0.10000000000000000555, "big": 1' + "0" * 40 + ', "s": "a\\u2028\\"b"}'
    assert pretty_json(text) == (
        '{\n  "n": 0.10000000000000000555,\n  "big": 1' + "0" * 40 + ',\n  "s": "a\\u2028\\"b"\n}'
    )
    assert pretty_json('{"a": [], "b": {}, "c": [1]}') == '{\n  "a": [],\n  "b": {},\n  "c": [\n    1\n  ]\n}'


@pytest.mark.parametrize("cut", [1, 5, 9, 14, 20, 23])
def test_a_payload_cut_anywhere_is_shown_as_far_as_it_goes(cut: int) -> None:
    body = '{"s": "é\\"x", "n": [1, 2]}'.encode()
    shown = shown_payload(body, limit=cut)
    assert (shown.shown, shown.size, shown.cut) == (cut, len(body), cut < len(body))
    head = body[:cut].decode(errors="ignore")
    assert _outside_strings(shown.text) == _outside_strings(head)


def _sent(**changes: object) -> SentRequest:
    values: dict[str, object] = {
        "event_id": "evt-1",
        "traceparent": None,
        "extra_headers": (("X-Api-Key", None), ("X-Team", "payments")),
        "last_started_at": datetime(2026, 3, 1, 12, 0, 0, 700000, tzinfo=UTC),
        "last_trace_id": None,
        "body": b"{}",
        **changes,
    }
    return SentRequest(**values)  # type: ignore[arg-type]


def test_the_headers_shown_hide_every_secret() -> None:
    shown = {h.name: h.value for h in sent_headers(_sent())}
    assert shown == {
        "Content-Type": "application/json",
        "User-Agent": "Hooklane",
        "X-Api-Key": HIDDEN,
        "X-Team": "payments",
        "webhook-id": "evt-1",
        "webhook-timestamp": str(int(datetime(2026, 3, 1, 12, tzinfo=UTC).timestamp())),
        "webhook-signature": HIDDEN,
    }


def test_before_any_attempt_the_timestamp_is_to_come_and_a_traced_one_names_its_trace() -> None:
    shown = {h.name: (h.value, h.note) for h in sent_headers(_sent(last_started_at=None, extra_headers=None))}
    assert shown["webhook-timestamp"] == ("-", "set by each attempt when it starts")
    assert "X-Api-Key" not in shown
    traced = {h.name: h.value for h in sent_headers(_sent(last_trace_id="4bf92f3577b34da6a3ce929d0e0e4736"))}
    assert traced["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-…"


@pytest.mark.parametrize("text", ["0", "-1", "x", "1.5", "٣", "00001", str(dashboard.MAX_TYPE_PAGE + 1)])
def test_a_page_number_out_of_bounds_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="page: must be a page number from 1 to"):
        dashboard.type_page({"page": text})


def test_a_page_number_is_read() -> None:
    assert dashboard.type_page({}) == dashboard.type_page({"page": ""}) == 1
    assert dashboard.type_page({"page": str(dashboard.MAX_TYPE_PAGE)}) == dashboard.MAX_TYPE_PAGE


def test_terms_stored_before_secret_headers_were_kept_say_none_is_known() -> None:
    """Their values are all hidden then (hooklane/store/sent.py)."""
    stored = (
        '{"headers": [["X-Team", "payments"]], "ca": null, "cert": null, "key": null, "server_name": null}'
    )
    assert RequestTerms.from_json(stored).secret_headers is None
    made = RequestTerms((("X-Team", "payments"),), secret_headers=("X-Team",))
    assert RequestTerms.from_json(made.to_json()) == made


def test_an_ordered_delivery_shows_its_key_and_number() -> None:
    shown = {h.name: (h.value, h.note) for h in sent_headers(_sent(ordering=("order-7", 3)))}
    assert shown["hooklane-ordering-key"] == ("order-7", None)
    assert shown["hooklane-ordering-sequence"] == (
        "3",
        "its number among its key's deliveries to this endpoint",
    )
    assert "hooklane-ordering-key" not in {h.name for h in sent_headers(_sent())}

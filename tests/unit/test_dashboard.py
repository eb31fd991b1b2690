"""The dashboard's pure parts (hooklane/api/dashboard.py): the ages and
texts it shows, when a pending delivery's next attempt is, its flash
messages, what counts as HTTPS, and the filters and inputs it checks. Over
HTTP: tests/db/test_dashboard.py; in a browser:
tests/browser/test_dashboard.py."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from hooklane.api import dashboard, inputs, pages
from hooklane.errors import InvalidInput
from hooklane.health import EndpointHealth

# --------------------------------------------------------------------------
# Logging in and out


# --------------------------------------------------------------------------
# What the pages show


# --------------------------------------------------------------------------
# Attempts: a delivery's timeline, an endpoint's over a time window


# --------------------------------------------------------------------------
# Repairing, with a worker delivering for real


# --------------------------------------------------------------------------
# Pure helpers


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (None, "-"),
        (-3, "0 ms"),
        (0.25, "250 ms"),
        (42.9, "42 s"),
        (60, "1 min"),
        (243, "4 min 3 s"),
        (7500, "2 h 5 min"),
        (3 * 86400 + 4 * 3600 + 59, "3 d 4 h"),
    ],
)
def test_age_text(seconds: float | None, shown: str) -> None:
    assert pages.age_text(seconds) == shown


def test_relative_text() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert pages.relative_text(None, now) == "-"
    assert pages.relative_text(now + timedelta(seconds=12), now) == "in 12 s"
    assert pages.relative_text(now - timedelta(minutes=3), now) == "3 min ago"
    assert pages.relative_text(now + timedelta(milliseconds=300), now) == "now"


NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)


def health(**row: Any) -> EndpointHealth:
    """An endpoint's health at NOW, active and signed unless ``row`` says."""
    base = dict.fromkeys(
        (
            "sending_on",
            "paused_until",
            "last_error",
            "last_delivered_at",
            "deactivated_reason",
            "throttled_until",
            "rate_per_second",
            "oldest_pending_age",
        ),
    )
    base.update(id=1, namespace="default", name="orders", tenant="acme", url="https://x.example/h")
    base.update(state="active", paused=False, signed=True, max_concurrency=4, effective_concurrency=4)
    base.update(
        adaptive_concurrency=False,
        rate_burst=1,
        ordering_on_dead="hold",
        pending=1,
        in_flight=0,
        dead=0,
        held_keys=0,
    )
    base.update(consecutive_failures=0, observed_at=NOW, counted_at=NOW)
    return EndpointHealth.from_row({**base, **row})


@pytest.mark.parametrize(
    ("due", "row", "held", "at", "text"),
    [
        (-21, {}, None, -21, "due 21 s ago"),
        (-0.5, {}, None, -0.5, "due now"),
        (40, {}, None, 40, "in 40 s"),
        # The report's: due 21 s ago, the circuit's next probe in 36 s.
        (
            -21,
            {"paused_until": NOW + timedelta(seconds=36), "consecutive_failures": 20},
            "after the circuit's pause",
            36,
            "in 36 s",
        ),
        # A retry later than the pause's end keeps its own time.
        (90, {"paused_until": NOW + timedelta(seconds=36)}, None, 90, "in 1 min 30 s"),
        # Probing: the pause is over, the delivery goes as it is due.
        (-5, {"paused_until": NOW - timedelta(seconds=1)}, None, -5, "due 5 s ago"),
        (
            -3,
            {"throttled_until": NOW + timedelta(seconds=8)},
            "after the receiver's hold (its Retry-After, or an overload)",
            8,
            "in 8 s",
        ),
        (-3, {"state": "deactivated"}, "once the endpoint is reactivated", None, ""),
        (
            -3,
            {"paused": True, "paused_until": NOW + timedelta(seconds=36)},
            "once the endpoint is resumed",
            None,
            "",
        ),
        (-3, {"signed": False}, "once the endpoint has a signing secret", None, ""),
    ],
)
def test_a_pending_deliverys_next_attempt_is_when_its_endpoint_lets_it_go(
    due: float, row: dict[str, Any], held: str | None, at: float | None, text: str
) -> None:
    shown = pages.next_attempt(NOW + timedelta(seconds=due), health(**row))
    assert shown == pages.NextAttempt(None if at is None else NOW + timedelta(seconds=at), held, text)
    assert pages.next_attempt(None, health(**row)) is None


def test_short_text_cuts_with_an_ellipsis() -> None:
    assert pages.short_text(None) == ""
    assert pages.short_text("x" * 80) == "x" * 80
    assert pages.short_text("x" * 81) == "x" * 79 + "\u2026"


def test_flash_messages_come_only_from_known_values() -> None:
    assert dashboard.flash_message(pages.flash_value("resent", 3)) == "3 dead deliveries queued again."
    assert dashboard.flash_message(pages.flash_value("resent", 1)) == "1 dead delivery queued again."
    assert dashboard.flash_message(pages.flash_value("resent", 0)) == "No dead deliveries to resend."
    assert dashboard.flash_message(pages.flash_value("resent-one", 7)) == "Delivery 7 queued again."
    assert dashboard.flash_message("not-dead.7").startswith("Delivery 7 is not dead any more")
    for forged in (None, "", "you have been hacked", "resent.1 <b>", "resent." + "9" * 40):
        assert dashboard.flash_message(forged) is None


@pytest.mark.parametrize(
    ("scheme", "forwarded", "secure"),
    [
        ("https", None, True),
        ("http", None, False),
        ("http", "https", True),
        ("http", "HTTPS, http", True),
        ("http", "http", False),
        ("http", "", False),
    ],
)
def test_is_https(scheme: str, forwarded: str | None, secure: bool) -> None:
    assert pages.is_https(scheme, forwarded) is secure


def test_the_filters_keep_what_was_chosen_and_default_to_the_last_hour() -> None:
    now = datetime(2026, 3, 1, 12, tzinfo=UTC)
    chosen = dashboard.attempt_filter({"status": "5xx", "failure": "", "outcome": ""}, now)
    assert (chosen.since, chosen.until) == (now - timedelta(hours=1), now)
    assert chosen.query() == [
        ("since", "2026-03-01T11:00:00Z"),
        ("until", "2026-03-01T12:00:00Z"),
        ("status", "5xx"),
    ]
    later = dashboard.attempt_filter({"until": "2026-03-02T00:00:00+02:00", "outcome": "retry"}, now)
    assert later.since == datetime(2026, 3, 1, 21, tzinfo=UTC) and later.outcome == "retry"
    assert dashboard.delivery_filter({"state": "", "status": "503", "failure": "timeout"}).query() == [
        ("status", "503"),
        ("failure", "timeout"),
    ]
    assert dashboard.delivery_filter({}).query() == []
    for bad in ({"status": "5"}, {"failure": "sad"}, {"state": "lost"}):
        with pytest.raises(InvalidInput):
            dashboard.delivery_filter(bad)
    with pytest.raises(InvalidInput, match="before until"):
        dashboard.attempt_filter({"since": "2026-03-01T12:00:00Z"}, now)
    # The range bounds the walk over the history, as in the admin API.
    with pytest.raises(InvalidInput, match="at most 31 days"):
        dashboard.attempt_filter({"since": "2026-01-01T00:00:00Z"}, now)
    # An hour before the first hour of year 1 does not exist: clamped.
    earliest = dashboard.attempt_filter({"until": "0001-01-01T00:10:00Z"}, now)
    assert earliest.since < earliest.until


def test_form_and_query_inputs_are_checked() -> None:
    # The dashboard's delivery ids are the API's and the CLI's (store.check_delivery_id).
    assert inputs.delivery_id("42") == 42
    for bad in ("", "-1", "4.2", "1" * 20, "9223372036854775808", "٣"):
        with pytest.raises(InvalidInput, match="delivery id"):
            inputs.delivery_id(bad)
    assert pages.state_filter(None) is None
    assert pages.state_filter("dead") == "dead"
    with pytest.raises(InvalidInput, match=re.escape("must be among")):
        pages.state_filter("lost")

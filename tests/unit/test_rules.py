"""The contract's delivery rules, as pure functions."""

from __future__ import annotations

import itertools
import math
import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hooklane.results import Result, ResultOutcome
from hooklane.worker.rules import (
    CATCH_UP,
    Attempt,
    Dead,
    Delivered,
    Paced,
    Retry,
    RetryPolicy,
    backoff_seconds,
    classify,
    clean_error,
    endpoint_policy,
    granted_here,
    paced_start,
    parse_retry_after,
    past_lease,
    result_of,
)

POLICY = RetryPolicy()
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=UTC)


def outcome(status=None, attempts=1, age=0.0, retry_after=None, error=None):
    return classify(Attempt(status, retry_after, error), attempts, age, POLICY, NOW, random.Random(7))


@pytest.mark.parametrize("attempts", range(1, 25))
def test_backoff_doubles_from_30s_capped_at_6h_half_jitter(attempts):
    exp = min(6 * 3600, 30 * 2 ** (attempts - 1))
    delays = [backoff_seconds(attempts, POLICY, random.Random(seed)) for seed in range(200)]
    assert all(exp / 2 <= d <= exp for d in delays)
    assert min(delays) < exp * 0.6 and max(delays) > exp * 0.9  # really jittered


def test_backoff_is_never_immediate():
    class Zero(random.Random):
        def random(self):
            return 0.0

    assert backoff_seconds(1, POLICY, Zero()) == 15.0


@pytest.mark.parametrize("status", [200, 201, 202, 204, 299])
def test_2xx_is_delivered(status):
    assert outcome(status) == Delivered(status)


@pytest.mark.parametrize("status", [301, 302, 307, 308, 400, 401, 404, 429, 500, 502, 503])
def test_other_statuses_retry(status):
    result = outcome(status)
    assert isinstance(result, Retry)
    assert result.error == f"HTTP {status}"
    assert 15 <= result.delay_seconds <= 30


def test_410_is_dead_and_deactivates():
    result = outcome(410)
    assert isinstance(result, Dead) and "deactivated" in result.error


def test_413_is_dead():
    assert isinstance(outcome(413), Dead)


def test_network_error_and_timeout_retry():
    result = outcome(None, error="timeout: no response within 5 s")
    assert isinstance(result, Retry) and result.error.startswith("timeout")


def test_retry_after_seconds_is_honoured():
    result = outcome(429, retry_after="3600")
    assert result.delay_seconds == 3600


def test_retry_after_is_capped_at_6h():
    result = outcome(503, retry_after=str(30 * 24 * 3600))
    assert result.delay_seconds == 6 * 3600


def test_retry_after_http_date():
    when = format_datetime(NOW + timedelta(seconds=600), usegmt=True)
    assert parse_retry_after(when, NOW) == 600
    assert outcome(503, retry_after=when).delay_seconds == 600


def test_retry_after_shorter_than_backoff_keeps_backoff():
    assert outcome(503, attempts=5, retry_after="1").delay_seconds >= 240


@pytest.mark.parametrize("value", ["", "soon", "-5", None])
def test_unparseable_retry_after_is_ignored(value):
    assert parse_retry_after(value, NOW) is None


def test_gives_up_after_20_attempts():
    assert isinstance(outcome(500, attempts=19), Retry)
    result = outcome(500, attempts=20)
    assert isinstance(result, Dead) and "20 attempts" in result.error


def test_gives_up_at_72_hours():
    assert isinstance(outcome(500, age=72 * 3600 - 1), Retry)
    assert outcome(500, age=72 * 3600) == Dead("HTTP 500; gave up at age 72 h")


@pytest.mark.parametrize(
    "max_age, age, shown", [(5400.0, 5400.4, "90 min"), (1.0, 1.3, "1 s"), (120.0, 150.0, "2 min")]
)
def test_an_endpoints_own_max_age_is_shown_in_its_unit(max_age, age, shown):
    policy = endpoint_policy(POLICY, None, max_age)
    assert isinstance(classify(Attempt(500), 1, max_age - 0.1, policy, NOW), Retry)
    assert classify(Attempt(500), 1, age, policy, NOW) == Dead(f"HTTP 500; gave up at age {shown}")


def test_an_endpoints_own_limits_replace_only_what_it_sets():
    assert endpoint_policy(POLICY, None, None) is POLICY
    assert endpoint_policy(POLICY, 3, None) == RetryPolicy(max_attempts=3)
    assert endpoint_policy(POLICY, None, 60.0) == RetryPolicy(max_age_seconds=60.0)
    assert outcome_with(endpoint_policy(POLICY, 3, None), attempts=3) == Dead(
        "HTTP 500; gave up after 3 attempts"
    )
    assert isinstance(outcome_with(endpoint_policy(POLICY, 3, None), attempts=2), Retry)


def outcome_with(policy, attempts):
    return classify(Attempt(500), attempts, 0.0, policy, NOW)


# What a receiver controls, and what aiohttp makes of it: header values are
# decoded as UTF-8 with surrogateescape, so any bytes arrive as some str.
_any_text = st.text(st.characters(exclude_categories=()))
_header_values = st.one_of(
    _any_text,
    st.binary().map(lambda b: b.decode("utf-8", "surrogateescape")),
    st.binary().map(lambda b: b.decode("latin-1")),
    st.text(st.characters(categories=["Nd", "No"])),
    st.integers(min_value=-(10**400), max_value=10**400).map(str),
    st.floats().map(str),
    st.builds(
        "{}, {:02d} {} {:04d} {:02d}:{:02d}:{:02d} {}".format,
        st.sampled_from(["Sun", "Mon", "Sunday", "Xyz"]),
        st.integers(-1, 100),
        st.sampled_from(["Jan", "Nov", "Dec", "Foo"]),
        st.integers(-1, 10**6),
        st.integers(-1, 100),
        st.integers(-1, 100),
        st.integers(-1, 100),
        st.one_of(
            st.sampled_from(["GMT", "UTC", "-0000", "EST"]),
            st.integers(-(10**30), 10**30).map("{:+d}".format),
        ),
    ),
)


@pytest.mark.parametrize(
    "value",
    [
        "\u0663",  # Arabic-Indic three: the defect of issue 7
        "\u00b2",
        "\u0663\u0660",
        "\uff15",  # fullwidth five
        "1\u0663",
        "-1",
        "+30",
        "1.5",
        "1e9",
        "inf",
        "nan",
        "0x10",
        "\udc80\udcff",
        "5\x00",
        "Sun, 06 Nov 99999 08:49:37 GMT",
        "Sun, 06 Nov 1994 08:49:37 +9999",
        "Sun, 06 Nov 1994 08:49:37 +" + "9" * 40,
        "Mon, 99 Foo 2024 99:99:99 GMT",
        "9" * 5000 + "x",
    ],
)
def test_retry_after_that_is_neither_ascii_digits_nor_a_date_is_ignored(value):
    assert parse_retry_after(value, NOW) is None
    result = outcome(503, attempts=3, retry_after=value)
    assert isinstance(result, Retry) and 60 <= result.delay_seconds <= 120


def test_retry_after_too_large_for_any_number_is_capped():
    assert outcome(503, retry_after="9" * 5000).delay_seconds == 6 * 3600
    assert outcome(503, retry_after="0" * 5000 + "600").delay_seconds == 600


@pytest.mark.parametrize(
    "value, seconds",
    [
        ("Fri, 31 Dec 9999 23:59:59 GMT", 6 * 3600),
        ("Sun, 06 Nov 1994 08:49:37 GMT", None),  # past: the backoff stands
        ("Sunday, 29-Nov-26 12:10:00 GMT", 600),  # RFC 850, obsolete but allowed
        ("Sun Nov 29 12:10:00 2026", 600),  # asctime
        (" \t600\t ", 600),
    ],
)
def test_retry_after_dates_far_and_past_and_obsolete_forms(value, seconds):
    result = outcome(503, retry_after=value)
    if seconds is None:
        assert 15 <= result.delay_seconds <= 30
    else:
        assert result.delay_seconds == seconds


@pytest.mark.parametrize(
    "status",
    [-1, 0, 1, 99, 600, 999, 1000, 2**31, -(2**63), pytest.param(10**5000, id="5001-digits")],
)
def test_statuses_outside_http_are_failures(status):
    result = outcome(status)
    assert result == Retry(result.delay_seconds, "invalid response: status out of range")
    assert 15 <= result.delay_seconds <= 30


@pytest.mark.parametrize("status", [100, 101, 199, 300, 599])
def test_statuses_inside_http_but_not_2xx_retry_with_their_number(status):
    assert outcome(status).error == f"HTTP {status}"


@pytest.mark.parametrize(
    "text, expected",
    [
        ("timeout: no response within 2 s", "timeout: no response within 2 s"),
        ("line one\nline two\r\n\tthree", "line one line two three"),
        ("nul\x00here", "nul?here"),
        ("lone \udc80 surrogate", "lone ? surrogate"),
        ("escape \x1b[31m red", "escape ?[31m red"),
        ("bidi \u202egnp.exe", "bidi ?gnp.exe"),
        ("   ", ""),
    ],
)
def test_errors_are_cleaned_to_one_printable_line(text, expected):
    assert clean_error(text) == expected


def test_errors_are_bounded():
    cleaned = clean_error("x" * 100_000)
    assert len(cleaned) == 200 and cleaned.endswith("...")


def test_an_error_that_cleans_to_nothing_falls_back_to_the_status():
    assert outcome(None, error="\n\n").error == "no response"
    assert outcome(503, error=" ").error == "HTTP 503"


def test_backoff_survives_an_attempt_limit_beyond_float_range():
    policy = RetryPolicy(max_attempts=10**9)
    result = classify(Attempt(500), 5000, 0.0, policy, NOW, random.Random(7))
    assert isinstance(result, Retry) and 3 * 3600 <= result.delay_seconds <= 6 * 3600


def _clean(error: str) -> bool:
    return (
        error.isprintable()
        and len(error) <= 260
        and error.encode("utf-8")  # no lone surrogates: Postgres would refuse them
        and "\x00" not in error
    )


@settings(deadline=None, max_examples=500)
@given(
    status=st.one_of(st.none(), st.integers(), st.integers(0, 999)),
    retry_after=st.one_of(st.none(), _header_values),
    error=st.one_of(st.none(), _any_text),
    attempts=st.integers(0, 10**6),
    age=st.floats(0, 10**9),
)
def test_classify_is_total(status, retry_after, error, attempts, age):
    policy = RetryPolicy(max_attempts=10**9, max_age_seconds=10**10)
    result = classify(Attempt(status, retry_after, error), attempts, age, policy, NOW)
    if status is not None and 200 <= status < 300:
        assert result == Delivered(status)
        return
    assert isinstance(result, (Retry, Dead))
    assert _clean(result.error)
    if isinstance(result, Retry):
        assert math.isfinite(result.delay_seconds)
        assert 0 < result.delay_seconds <= policy.cap_seconds


@settings(deadline=None, max_examples=500)
@given(_header_values)
def test_parse_retry_after_is_total(value):
    seconds = parse_retry_after(value, NOW)
    assert seconds is None or seconds >= 0  # never NaN; inf is capped by classify


@settings(deadline=None)
@given(_any_text)
def test_clean_error_is_total(text):
    assert clean_error(text) == "" or _clean(clean_error(text))


# --- what the worker records ------------------------------------------------
def test_each_outcome_maps_to_one_store_result():
    assert result_of(7, 2, Attempt(204), Delivered(204)) == Result.delivered(7, 2, status=204)
    assert result_of(7, 2, Attempt(503), Retry(30.0, "HTTP 503")) == Result(
        7, 2, ResultOutcome.RETRY, 30.0, 503, "HTTP 503"
    )
    # the status that killed it is kept; a refusal without one has none
    assert result_of(7, 2, Attempt(410), Dead("HTTP 410: endpoint gone")) == Result(
        7, 2, ResultOutcome.DEAD, None, 410, "HTTP 410: endpoint gone"
    )
    assert result_of(7, 20, Attempt(None, error="timed out"), Dead("timed out")).status is None


@given(st.sampled_from([200, 410, 413, 500, None]), st.integers(1, 30), st.floats(0, 1e7))
def test_every_classified_attempt_has_a_result(status, attempts, age):
    attempt = Attempt(status, error=None if status else "connection refused")
    result = result_of(1, attempts, attempt, classify(attempt, attempts, age, POLICY, NOW))
    assert result.outcome in ResultOutcome
    assert (result.retry_in is not None) == (result.outcome == ResultOutcome.RETRY)
    assert (result.error is None) == (result.outcome == ResultOutcome.DELIVERED)


# A grant's start on the database's clock, and the answer that carried it.
_ANSWERED = datetime(2026, 1, 1, tzinfo=UTC)


def test_a_start_counts_from_the_answer_as_the_database_counted_it():
    # The answer arrived at 100.0 here, 0.3 s before the grant's start.
    assert granted_here(_ANSWERED + timedelta(seconds=0.3), _ANSWERED, received=100.0) == pytest.approx(100.3)


def test_a_round_that_ran_long_does_not_delay_the_starts_it_granted():
    # Granted at the round's start (now(): 0.5 s before the answer) for
    # 0.6 s after it: 0.1 s after the answer, not 0.6 s as a wait counted
    # from the answer's arrival made it, onto the next round's starts.
    granted_at = _ANSWERED - timedelta(seconds=0.5)
    assert granted_here(granted_at + timedelta(seconds=0.6), _ANSWERED, received=7.0) == pytest.approx(7.1)
    # a start whose time passed while the round ran is due already
    assert granted_here(granted_at + timedelta(seconds=0.2), _ANSWERED, received=7.0) < 7.0


@given(ahead=st.floats(min_value=-5, max_value=5), received=st.floats(min_value=0, max_value=1e6))
def test_a_start_is_never_sooner_than_granted(ahead, received):
    # The grant, ``ahead`` of the answer on the database's clock, is as far
    # ahead of the answer's arrival here.
    start = _ANSWERED + timedelta(seconds=ahead)
    assert granted_here(start, _ANSWERED, received) - received == pytest.approx(ahead, abs=1e-6)


def test_starts_on_time_go_at_their_grants_and_a_burst_together():
    previous = Paced(granted=10.0, started=10.0)
    assert paced_start(10.01, 10.01, previous, cap=0.5) == 10.01
    assert paced_start(10.0, 10.0, previous, cap=0.5) == 10.0  # a burst's grants share a time
    assert paced_start(10.5, 10.2, None, cap=0.5) == 10.5  # never sooner than granted


def test_late_starts_catch_up_spaced_not_at_once():
    # A stall woke five starts granted 10 ms apart, 200 ms late: they go
    # 8 ms apart (the grants' spacing over CATCH_UP), not in one instant.
    previous: Paced | None = Paced(granted=9.99, started=9.99)
    starts = []
    for i in range(5):
        granted = 10.0 + i * 0.01
        start = paced_start(granted, 10.2, previous, cap=0.5)
        previous = Paced(granted, start)
        starts.append(start)
    gaps = [b - a for a, b in itertools.pairwise(starts)]
    assert starts[0] == pytest.approx(10.2)
    assert gaps == pytest.approx([0.01 / CATCH_UP] * 4)
    # and once caught up, the grants' own times again
    assert paced_start(10.6, 10.6, Paced(10.59, 10.59), cap=0.5) == pytest.approx(10.6)


def test_a_start_is_held_back_no_more_than_the_cap_past_its_grant():
    # far behind: the lease must still cover the call
    assert paced_start(10.0, 10.0, Paced(granted=9.99, started=12.0), cap=0.5) == pytest.approx(10.5)
    # a start already later than the cap goes at once
    assert paced_start(10.0, 11.0, Paced(granted=9.99, started=12.0), cap=0.5) == pytest.approx(11.0)


@given(
    gaps=st.lists(st.floats(min_value=0, max_value=0.2), min_size=1, max_size=30),
    late=st.floats(min_value=0, max_value=2),
)
def test_paced_starts_keep_order_never_precede_grants_and_keep_the_catch_up_rate(gaps, late):
    # Every grant woken at once, ``late`` after the first one's time.
    granted = list(itertools.accumulate([0.0, *gaps]))
    now = late
    previous: Paced | None = None
    starts = []
    for g in granted:
        start = paced_start(g, now, previous, cap=10.0)
        previous = Paced(g, start)
        starts.append(start)
    for g, s in zip(granted, starts, strict=True):
        assert s >= g - 1e-12
    for (g1, s1), (g2, s2) in itertools.pairwise(zip(granted, starts, strict=True)):
        assert s2 - s1 >= (g2 - g1) / CATCH_UP - 1e-9


def test_a_call_is_past_its_lease_only_when_it_starts_later_than_the_grace():
    # The lease ends deadline + grace after the grant, the call deadline
    # after its start: starting within the grace, the answer comes in time.
    assert not past_lease(100.0, 100.0, 10.0)
    assert not past_lease(100.0, 110.0, 10.0)
    assert past_lease(100.0, 110.5, 10.0)

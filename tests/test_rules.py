"""The contract's delivery rules, as pure functions."""

from __future__ import annotations

import random
from datetime import datetime, timedelta, timezone
from email.utils import format_datetime

import pytest

from hooklane.worker.rules import (
    Attempt,
    Dead,
    Delivered,
    Retry,
    RetryPolicy,
    backoff_seconds,
    classify,
    parse_retry_after,
)

POLICY = RetryPolicy()
NOW = datetime(2026, 11, 29, 12, 0, tzinfo=timezone.utc)


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
    assert isinstance(outcome(500, age=72 * 3600), Dead)

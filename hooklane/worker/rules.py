"""Pure delivery decisions: what a response means and when to try again.

Nothing here does I/O, so every rule of the contract is testable directly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import datetime, timezone
from email.utils import parsedate_to_datetime

from hooklane.policies import RetryPolicy


@dataclass(frozen=True)
class Attempt:
    """What one HTTP call gave: a status, or an error when there was none."""

    status: int | None
    retry_after: str | None = None
    error: str | None = None


@dataclass(frozen=True)
class Delivered:
    status: int


@dataclass(frozen=True)
class Retry:
    delay_seconds: float
    error: str


@dataclass(frozen=True)
class Dead:
    error: str


Outcome = Delivered | Retry | Dead


def backoff_seconds(
    attempts: int, policy: RetryPolicy, rng: random.Random | None = None
) -> float:
    """Delay after the ``attempts``-th failure: exponential from the base,
    capped, half of it fixed and half random so that deliveries that failed
    together do not come back together. Never zero."""
    exp = min(policy.cap_seconds, policy.base_seconds * 2 ** max(attempts - 1, 0))
    return exp / 2 + (rng or random).random() * (exp / 2)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds a ``Retry-After`` header asks for (delta or HTTP date)."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=timezone.utc)
    return max(0.0, (when - now).total_seconds())


def classify(
    attempt: Attempt,
    attempts: int,
    age_seconds: float,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of one call, by the contract's table of responses."""
    status = attempt.status
    if status is not None and 200 <= status < 300:
        return Delivered(status)
    error = attempt.error or f"HTTP {status}"
    if status == 410:
        return Dead(error + ": endpoint gone, deactivated")
    if status == 413:
        return Dead(error + ": payload too large for the receiver")
    if attempts >= policy.max_attempts:
        return Dead(f"{error}; gave up after {attempts} attempts")
    if age_seconds >= policy.max_age_seconds:
        return Dead(f"{error}; gave up at age {age_seconds / 3600:.0f} h")
    delay = backoff_seconds(attempts, policy, rng)
    asked = parse_retry_after(attempt.retry_after, now)
    if asked is not None:
        delay = max(delay, min(asked, policy.cap_seconds))
    return Retry(delay, error)

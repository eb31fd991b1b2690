"""Pure delivery decisions: what a response means and when to try again.

Nothing here does I/O, so every rule of the contract is testable directly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from hooklane.policies import RetryPolicy
from hooklane.results import FailureClass, Result, Timing


@dataclass(frozen=True)
class Attempt:
    """What one HTTP call gave: a status, or an error and its class when
    there was none."""

    status: int | None
    retry_after: str | None = None
    error: str | None = None
    failure: FailureClass | None = None


@dataclass(frozen=True)
class Delivered:
    status: int


@dataclass(frozen=True)
class Retry:
    delay_seconds: float
    error: str
    # The receiver's Retry-After (capped) when it asked for one.
    retry_after: float | None = None


@dataclass(frozen=True)
class Dead:
    error: str


Outcome = Delivered | Retry | Dead

_MAX_DOUBLINGS = 1000
_ERROR_CHARS = 200


def backoff_seconds(attempts: int, policy: RetryPolicy, rng: random.Random | None = None) -> float:
    """Delay after the ``attempts``-th failure: exponential from the base,
    capped, half of it fixed and half random so that deliveries that failed
    together do not come back together. Never zero."""
    # The exponent is clipped so that a large attempt limit from the
    # environment cannot overflow a float; the cap is reached long before.
    doublings = min(max(attempts - 1, 0), _MAX_DOUBLINGS)
    exp = min(policy.cap_seconds, policy.base_seconds * 2.0**doublings)
    return exp / 2 + (rng or random).random() * (exp / 2)


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds a ``Retry-After`` header asks for: delay-seconds (ASCII digits
    only, RFC 9110) or an HTTP-date; ``None`` for anything else. The header
    is the receiver's to write, so nothing in it makes this raise. A number
    too large for a float asks for ``inf``; the caller caps it."""
    if not value:
        return None
    value = value.strip(" \t")
    # Only ASCII is HTTP: this also rules out the Unicode digits that
    # ``isdigit`` accepts and ``float`` does not, and the lone surrogates
    # aiohttp makes of bytes that are not UTF-8.
    if not value.isascii():
        return None
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (ValueError, OverflowError):
        # a date the datetime type cannot hold (year 0 or past 9999, an
        # offset of days) is as meaningless as one that does not parse
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - now).total_seconds())


def granted_here(start_at: datetime, answered_at: datetime, received: float) -> float:
    """When a granted call may start, on this process's monotonic clock:
    ``start_at`` and ``answered_at`` are on the database's (the grant's
    start, and the clock as the reservation answered), ``received`` on this
    process's (when the answer arrived).

    The grant counts from the answer, as the database's clock at the answer
    maps onto its arrival here: the answer left after ``answered_at``, so a
    start is never sooner than granted (a rate limit's spacing holds), and
    later only by the answer's way back. Counted from when the answer
    arrived as if the grant were made then, a round that ran for half a
    second pushed every start half a second late, onto the next round's
    (issue 37); counted from when the query was sent, a start would be
    early by the query's way there; a clock offset measured apart costs a
    round trip of its own and errs by half of one either way."""
    return received + (start_at - answered_at).total_seconds()


# How much faster than its grants a worker makes an endpoint's starts that
# came late: a stall of its loop (a starved CPU) wakes a pile of them at
# once, which would go out in the same instant and crowd the second they
# land in with the next second's own; spaced, they catch up at 1.25 times
# the rate.
CATCH_UP = 1.25


@dataclass(frozen=True)
class Paced:
    """An endpoint's latest start on this worker: its grant's time and when
    it was made (this process's monotonic clock)."""

    granted: float
    started: float


def past_lease(granted: float, now: float, grace: float) -> bool:
    """Whether a call granted for ``granted`` (monotonic) and starting
    ``now`` could still be answered after its lease ends: the lease lasts
    the endpoint's deadline and ``grace`` from the grant, the call its
    deadline from its start. Only a stalled worker starts that late; by
    then the delivery may have been rescued and sent again, and, ordered,
    its key moved on, so the call would reach the receiver after a later
    one of the same key."""
    return now - granted > grace


def paced_start(granted: float, now: float, previous: Paced | None, cap: float) -> float:
    """When a call granted for ``granted`` (monotonic) may start, at ``now``
    after its wait: at its grant's time, unless starts of its endpoint came
    late, when it is no closer to the ``previous`` start than the grants
    were to each other, over ``CATCH_UP``. Grants of the same time (a
    burst) go together. ``cap``: the most a start is held back past its
    grant, which its lease must outlast."""
    start = max(granted, now)
    if previous is not None and granted >= previous.granted:
        start = max(start, previous.started + (granted - previous.granted) / CATCH_UP)
    return min(start, max(granted + cap, now))


def clean_error(text: str) -> str:
    """``text`` as a single printable line of bounded length. Errors are
    stored in Postgres text columns and read by tenants: a NUL or a lone
    surrogate would make the statement that records a whole batch fail, and
    a receiver's bytes have no business in either."""
    line = " ".join(text.split())
    if len(line) > _ERROR_CHARS:
        line = line[: _ERROR_CHARS - 3] + "..."
    # Also replaced: format characters such as bidi overrides, which could
    # make a stored error read as something it is not.
    return "".join(c if c.isprintable() else "?" for c in line)


def _age(seconds: float) -> str:
    """An age in the unit it reads best in: an endpoint's own maxAge may be
    minutes or seconds, which in hours would read "0 h"."""
    if seconds >= 7200:
        return f"{seconds / 3600:.0f} h"
    if seconds >= 120:
        return f"{seconds / 60:.0f} min"
    return f"{seconds:.0f} s"


def classify(
    attempt: Attempt,
    attempts: int,
    age_seconds: float,
    policy: RetryPolicy,
    now: datetime,
    rng: random.Random | None = None,
) -> Outcome:
    """The outcome of one call, by the contract's table of responses. Total:
    any status, header or error text gives an outcome, whose error is clean
    to store and whose delay is finite and at most the cap."""
    status = attempt.status
    if status is not None and 200 <= status < 300:
        return Delivered(status)
    error = _failure(attempt)
    if status == 410:
        return Dead(error + ": endpoint gone, deactivated")
    if status == 413:
        return Dead(error + ": payload too large for the receiver")
    if attempts >= policy.max_attempts:
        return Dead(f"{error}; gave up after {attempts} attempts")
    if age_seconds >= policy.max_age_seconds:
        return Dead(f"{error}; gave up at age {_age(age_seconds)}")
    delay = backoff_seconds(attempts, policy, rng)
    asked = parse_retry_after(attempt.retry_after, now)
    if asked is None:
        return Retry(delay, error)
    asked = min(asked, policy.cap_seconds)
    return Retry(max(delay, asked), error, asked)


def endpoint_policy(
    policy: RetryPolicy, max_attempts: int | None, max_age_seconds: float | None
) -> RetryPolicy:
    """``policy`` with an endpoint's own limits (spec.delivery.retry) in
    place of the settings' where it sets them."""
    if max_attempts is None and max_age_seconds is None:
        return policy
    return replace(
        policy,
        max_attempts=max_attempts or policy.max_attempts,
        max_age_seconds=max_age_seconds or policy.max_age_seconds,
    )


def result_of(
    delivery_id: int, attempts: int, attempt: Attempt, outcome: Outcome, timing: Timing | None = None
) -> Result:
    """What the worker records of an attempt's ``outcome``: the one mapping
    from these outcomes to the store's. ``attempts`` is the fence the
    delivery was reserved with; the HTTP status (or the failure class) is
    kept whatever the outcome, so a dead delivery shows what killed it."""
    match outcome:
        case Delivered(status=status):
            return Result.delivered(delivery_id, attempts, status=status, timing=timing)
        case Retry(delay_seconds=delay, error=error, retry_after=asked):
            return Result.retry(
                delivery_id,
                attempts,
                retry_in=delay,
                status=attempt.status,
                error=error,
                failure=attempt.failure,
                retry_after=asked,
                timing=timing,
            )
        case Dead(error=error):
            return Result.dead(
                delivery_id,
                attempts,
                status=attempt.status,
                error=error,
                failure=attempt.failure,
                timing=timing,
            )


def _failure(attempt: Attempt) -> str:
    error = clean_error(attempt.error or "")
    if error:
        return error
    if attempt.status is None:
        return "no response"
    if 100 <= attempt.status <= 599:
        return f"HTTP {attempt.status}"
    # RFC 9110 defines 100-599 only; a number beyond is not an HTTP answer
    # (and a big enough one would not even format).
    return "invalid response: status out of range"

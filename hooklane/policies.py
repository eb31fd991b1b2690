"""Delivery policies: when to retry and when to open the circuit, with the
bounds that keep them meaningful. Plain values, shared by the settings, the
worker's rules and the store, so that none of those imports another."""

from __future__ import annotations

from typing import Annotated

from pydantic import Field
from pydantic.dataclasses import dataclass

# A duration from configuration: zero or negative makes a loop spin or a
# retry fire at once, and nan compares false with everything.
Seconds = Annotated[float, Field(gt=0, allow_inf_nan=False)]
# A count of attempts, failures, slots or rows: zero would do nothing, silently.
Count = Annotated[int, Field(ge=1)]


@dataclass(frozen=True)
class RetryPolicy:
    """Backoff from ``base`` doubling up to ``cap``; dead after
    ``max_attempts`` attempts or at ``max_age`` seconds of age."""

    base_seconds: Seconds = 30.0
    cap_seconds: Seconds = 6 * 3600.0
    max_attempts: Count = 20
    max_age_seconds: Seconds = 72 * 3600.0

    def __post_init__(self) -> None:
        if self.cap_seconds < self.base_seconds:
            raise ValueError(
                f"cap_seconds ({self.cap_seconds:g}) must be at least base_seconds ({self.base_seconds:g})"
            )


@dataclass(frozen=True)
class CircuitPolicy:
    """Consecutive failures that pause an endpoint, and for how long: each
    failure from the threshold on pauses it ``step`` x (failures past the
    threshold + 1), up to ``cap``."""

    threshold: Count = 20
    step_seconds: Seconds = 60.0
    cap_seconds: Seconds = 3600.0

    def __post_init__(self) -> None:
        if self.cap_seconds < self.step_seconds:
            raise ValueError(
                f"cap_seconds ({self.cap_seconds:g}) must be at least step_seconds ({self.step_seconds:g})"
            )

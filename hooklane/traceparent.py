"""The W3C ``traceparent`` value (Trace Context, level 1): read and written
here, checked once where it comes in (the API's header, ``publish``'s
argument) so that what is stored and sent on is always well formed.
Pure: :mod:`hooklane.tracing` turns it into OpenTelemetry's contexts."""

from __future__ import annotations

import re
from dataclasses import dataclass

from hooklane.errors import InvalidInput, shown

# Version 00 only: a later version may add fields, and what is stored is
# sent on to receivers as it is, so only what every reader knows is taken.
# Lowercase hex, as the recommendation writes it.
_TRACEPARENT = re.compile(r"00-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16
SAMPLED = 0x01


@dataclass(frozen=True)
class TraceParent:
    """A checked ``traceparent``: ids as lowercase hex, flags as a byte."""

    trace_id: str
    span_id: str
    flags: int

    @property
    def sampled(self) -> bool:
        return bool(self.flags & SAMPLED)

    def __str__(self) -> str:
        return f"00-{self.trace_id}-{self.span_id}-{self.flags:02x}"


def parse_traceparent(value: object, field: str) -> TraceParent:
    """``value`` as a traceparent; ``InvalidInput`` naming ``field`` when it
    is not one: version 00, a 32-hex trace id and a 16-hex span id neither
    of them all zeros, 2-hex flags, dash-separated, in lowercase."""
    if not isinstance(value, str):
        raise InvalidInput(field, f"must be a W3C traceparent text, not {shown(value)}")
    found = _TRACEPARENT.fullmatch(value)
    if found is None:
        raise InvalidInput(
            field,
            "must be a W3C traceparent: 00-<32 hex trace id>-<16 hex span id>-<2 hex flags>, "
            f"lowercase, not {shown(value)}",
        )
    trace_id, span_id, flags = found.groups()
    if trace_id == _ZERO_TRACE:
        raise InvalidInput(field, "has an all-zero trace id, which W3C Trace Context forbids")
    if span_id == _ZERO_SPAN:
        raise InvalidInput(field, "has an all-zero parent span id, which W3C Trace Context forbids")
    return TraceParent(trace_id, span_id, int(flags, 16))


def format_traceparent(trace_id: int, span_id: int, flags: int) -> str:
    """The traceparent of a span context as OpenTelemetry holds one (ids as
    integers)."""
    return f"00-{trace_id:032x}-{span_id:016x}-{flags:02x}"

"""Times as the CLI and the HTTP API take and show them: RFC 3339, always
with a timezone."""

from __future__ import annotations

from datetime import UTC, datetime

from hooklane.errors import InvalidInput, shown

_MAX_TIME_CHARS = 64


def parse_time(text: str, field: str) -> datetime:
    """An RFC 3339 time (``2026-03-01T12:00:00Z``, ``...+02:00``), in UTC;
    refused without a timezone, which would mean another instant on each
    machine, and when its instant lies outside the years 1 to 9999 in UTC
    (``0001-01-01T00:00:00+14:00``), which no datetime can hold."""
    try:
        if len(text) > _MAX_TIME_CHARS:
            raise ValueError
        value = datetime.fromisoformat(text)
    except ValueError:
        raise InvalidInput(
            field, f"must be an RFC 3339 time like 2026-03-01T12:00:00Z, not {shown(text)}"
        ) from None
    if value.utcoffset() is None:
        raise InvalidInput(field, f"needs a timezone (2026-03-01T12:00:00Z or +02:00), not {shown(text)}")
    try:
        return value.astimezone(UTC)
    except OverflowError:
        raise InvalidInput(field, f"lies outside the years 1 to 9999 in UTC: {shown(text)}") from None


def rfc3339(value: datetime | None) -> str | None:
    """``value`` in UTC, as ``2026-03-01T12:00:00.123456Z``."""
    return None if value is None else value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def rfc3339_seconds(value: datetime | None) -> str | None:
    """``value`` in UTC to the second, as ``2026-03-01T12:00:00Z``: for a
    person's eyes (the CLI's tables) and for Kubernetes, whose own times
    (a condition's lastTransitionTime) have this form."""
    return None if value is None else value.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")

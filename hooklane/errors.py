"""The errors Hooklane raises at its boundaries."""

from __future__ import annotations

import reprlib
from typing import Any


class HooklaneError(Exception):
    """Base of every error Hooklane raises on purpose."""


class InvalidInput(HooklaneError, ValueError):
    """Input refused before anything was stored. ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


class DatabaseUnreachable(HooklaneError):
    """No connection to Hooklane's database could be made."""


_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 60
_SHORT.maxlevel = 2


def shown(value: Any) -> str:
    """A refused value as a message may quote it: short, and with control
    characters escaped, whatever its size, depth or type."""
    try:
        return _SHORT.repr(value)
    except ValueError:
        # repr() refuses integers of more than 4300 digits.
        return f"a {type(value).__name__} too large to print"


def printable(text: str) -> str:
    """``text`` with every non-printable character escaped as repr() would,
    so that what reaches a terminal cannot move its cursor or recolour it."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


class EventConflict(InvalidInput):
    """An event id the tenant already published, with different content.
    Nothing was stored, and the caller's transaction is still usable."""

    def __init__(self, event_id: str, tenant: str) -> None:
        super().__init__(
            "id",
            f"{shown(event_id)} was already published by tenant {shown(tenant)} with different "
            "content (type, data or coalesce_key); an id names one event",
        )
        self.event_id = event_id
        self.tenant = tenant

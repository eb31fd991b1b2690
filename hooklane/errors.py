"""The errors Hooklane raises at its boundaries."""

from __future__ import annotations


class HooklaneError(Exception):
    """Base of every error Hooklane raises on purpose."""


class InvalidInput(HooklaneError, ValueError):
    """Input refused before anything was stored. ``field`` names the culprit."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message

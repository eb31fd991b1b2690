"""Hooklane: webhook delivery with a queue per endpoint."""

from hooklane.publish import publish

__all__ = ["publish"]

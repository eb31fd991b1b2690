"""Hooklane: webhook delivery with a queue per endpoint."""

from importlib.metadata import PackageNotFoundError, version

from hooklane.publish import publish

# pyproject.toml holds the version; everything else reads it from here.
try:
    __version__ = version("hooklane")
except PackageNotFoundError:  # a source tree on sys.path that was never installed
    __version__ = "0.0.0+unknown"

__all__ = ["__version__", "publish"]

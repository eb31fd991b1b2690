"""The ``hooklane`` command's version is read from pyproject.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

from hooklane import __version__


def test_the_version_is_read_from_pyproject():
    pyproject = tomllib.loads((Path(__file__).resolve().parents[2] / "pyproject.toml").read_text())
    assert __version__ == pyproject["project"]["version"]

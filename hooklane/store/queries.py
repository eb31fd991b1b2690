"""The named SQL statements of ``queries.sql``, loaded once."""

from __future__ import annotations

import re
from importlib import resources

_BLOCK_START = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def parse(text: str) -> dict[str, str]:
    """Named blocks ("-- name: NAME", comment lines, the statement) by name."""
    parts = _BLOCK_START.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    statements = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        statements[name] = sql.strip().rstrip(";")
    return statements


QUERIES: dict[str, str] = parse(resources.files("hooklane.store").joinpath("queries.sql").read_text())

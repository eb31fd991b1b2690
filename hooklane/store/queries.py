"""The named SQL statements of ``queries.sql``, loaded once.

A statement names its parameters, ``%(name)s``, as procrastinate (and
psycopg) write them; ``%%`` is a literal ``%``. Loading turns them into
asyncpg's ``$1..$n`` once, keeping which name each number stands for, and a
statement is called with keywords only::

    await conn.fetch(*QUERIES["reserve"](partitions=owned, limit=10, ...))

A missing or unknown name raises ``TypeError`` before anything is sent, so
that a misspelt keyword fails at its first call instead of binding a value
to the wrong parameter.
"""

from __future__ import annotations

import keyword
import re
from importlib import resources

_BLOCK_START = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)
# A parameter, an escaped percent sign, or a percent sign that is neither.
_PERCENT = re.compile(r"%\((?P<name>[^)]*)\)s|(?P<escaped>%%)|%")
# asyncpg's own placeholders, which a statement never writes: it names its
# parameters, and the numbers are the loader's.
_POSITIONAL = re.compile(r"\$\d")


def parse(text: str) -> dict[str, str]:
    """Named blocks ("-- name: NAME", comment lines, the statement) by name,
    as written."""
    parts = _BLOCK_START.split(text)
    # parts = [preamble, name1, body1, name2, body2, ...]
    statements = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=False):
        sql = "\n".join(line for line in body.splitlines() if not line.startswith("--"))
        statements[name] = sql.strip().rstrip(";")
    return statements


def to_positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """``sql`` with each ``%(name)s`` turned into ``$n`` (one number per
    name, numbered in order of first use) and each ``%%`` into ``%``; and
    the names in number order. ``ValueError`` for any other ``%``, a name
    that is no Python keyword argument, or a ``$n`` written by hand."""
    if found := _POSITIONAL.search(sql):
        raise ValueError(f"{found[0]!r} written by hand: name the parameter, %(name)s")
    names: dict[str, int] = {}

    def replace(match: re.Match[str]) -> str:
        name = match["name"]
        if match["escaped"]:
            return "%"
        if name is None:
            raise ValueError(f"a lone '%' at {sql[match.start() : match.start() + 12]!r}: write '%%'")
        if not name.isidentifier() or keyword.iskeyword(name):
            raise ValueError(f"parameter %({name})s: a parameter's name is a Python identifier")
        return f"${names.setdefault(name, len(names) + 1)}"

    return _PERCENT.sub(replace, sql), tuple(names)


class Query:
    """One statement: ``sql`` in asyncpg's form, and ``params``, the names
    its ``$1..$n`` stand for; ``written``, as queries.sql has it (psycopg's
    form), for the publishing callers of other drivers."""

    __slots__ = ("_names", "name", "params", "sql", "written")

    def __init__(self, name: str, sql: str, params: tuple[str, ...], written: str = "") -> None:
        self.name = name
        self.sql = sql
        self.params = params
        self.written = written
        self._names = frozenset(params)

    def colon_named(self) -> str:
        """The statement with ``:name`` parameters, as SQLAlchemy's
        ``text()`` takes them."""
        return _PERCENT.sub(lambda m: f":{m['name']}" if m["name"] else "%", self.written)

    def __repr__(self) -> str:
        return f"Query({self.name!r}, params={self.params!r})"

    def args(self, **values: object) -> tuple[object, ...]:
        """The values of ``$1..$n``, taken by name: every parameter, and
        nothing else. For ``executemany``, one tuple per row."""
        if values.keys() != self._names:
            missing = ", ".join(p for p in self.params if p not in values) or "none"
            unknown = ", ".join(sorted(values.keys() - self._names)) or "none"
            raise TypeError(
                f"statement {self.name}: missing parameters: {missing}; unknown parameters: {unknown} "
                f"(it takes {', '.join(self.params) or 'none'})"
            )
        return tuple(map(values.__getitem__, self.params))

    def __call__(self, **values: object) -> tuple[str, *tuple[object, ...]]:
        """``(sql, *args)``, to unpack into asyncpg's ``fetch``, ``execute``..."""
        return (self.sql, *self.args(**values))


def load(text: str) -> dict[str, Query]:
    """Every named block of ``text``, converted (:func:`to_positional`).
    ``ValueError`` naming the statement that does not convert."""
    queries = {}
    for name, sql in parse(text).items():
        try:
            queries[name] = Query(name, *to_positional(sql), written=sql)
        except ValueError as exc:
            raise ValueError(f"queries.sql, statement {name}: {exc}") from None
    return queries


QUERIES: dict[str, Query] = load(resources.files("hooklane.store").joinpath("queries.sql").read_text())

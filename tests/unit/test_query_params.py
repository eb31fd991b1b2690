"""Statements name their parameters (``%(name)s`` in queries.sql), the
loader numbers them once for asyncpg, and every call passes them by name.
That each prepares on Postgres: tests/db/test_query_params.py."""

from __future__ import annotations

import ast
import re
from importlib import resources
from pathlib import Path

import pytest

from hooklane.store.queries import QUERIES, Query, load, to_positional

STORE = Path(__file__).resolve().parents[2] / "hooklane" / "store"


# --- the conversion (pure) ----------------------------------------------------


def test_names_become_numbers_in_order_of_first_use_and_a_name_used_twice_is_one_number():
    sql, names = to_positional("SELECT %(b)s::int[], %(a)s, coalesce(%(b)s::int[], '{}'), %(a)s || 'x'")
    assert sql == "SELECT $1::int[], $2, coalesce($1::int[], '{}'), $2 || 'x'"
    assert names == ("b", "a")


def test_a_doubled_percent_sign_is_a_literal_one():
    sql, names = to_positional("SELECT format('%%s of %%s', %(n)s::text), 7 %% 3, '100%%'")
    assert (sql, names) == ("SELECT format('%s of %s', $1::text), 7 % 3, '100%'", ("n",))
    # Not a parameter: the first two signs are the escape, the rest is text.
    assert to_positional("SELECT '%%(n)s'") == ("SELECT '%(n)s'", ())
    assert to_positional("SELECT 1") == ("SELECT 1", ())


@pytest.mark.parametrize(
    ("sql", "says"),
    [
        ("SELECT 7 % 3", "a lone '%'"),
        ("SELECT format('%s', %(n)s)", "a lone '%'"),
        ("SELECT %(n)d", "a lone '%'"),
        ("SELECT %(n", "a lone '%'"),
        ("SELECT $1", "'$1' written by hand"),
        ("SELECT %(n)s, $2", "'$2' written by hand"),
        ("SELECT %()s", "a Python identifier"),
        ("SELECT %(from)s", "a Python identifier"),
        ("SELECT %(a-b)s", "a Python identifier"),
    ],
)
def test_what_is_not_a_parameter_is_refused_at_load(sql, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        to_positional(sql)


def test_a_statement_that_does_not_convert_is_named():
    with pytest.raises(ValueError, match=r"statement broken: a lone '%'"):
        load("-- name: fine\nSELECT %(a)s;\n\n-- name: broken\n-- comment: 100% ok\nSELECT 7 % 3;\n")
    # comment lines are not part of the statement
    assert load("-- name: fine\n-- 100% of %(nothing)s\nSELECT %(a)s;\n")["fine"].params == ("a",)


# --- calling by name (pure) ---------------------------------------------------

PAGE = Query("page", "SELECT $1, $2, $1", ("tenant", "limit"))


def test_a_call_takes_every_parameter_by_name_in_any_order():
    assert PAGE.args(limit=10, tenant="acme") == ("acme", 10)
    assert PAGE(limit=10, tenant="acme") == ("SELECT $1, $2, $1", "acme", 10)
    assert Query("none", "SELECT 1", ())() == ("SELECT 1",)


def test_a_misspelt_or_missing_name_fails_loudly_at_the_call():
    with pytest.raises(TypeError) as misspelt:
        PAGE(tenant="acme", limt=10)
    assert str(misspelt.value) == (
        "statement page: missing parameters: limit; unknown parameters: limt (it takes tenant, limit)"
    )
    with pytest.raises(TypeError, match="missing parameters: limit; unknown parameters: none"):
        PAGE.args(tenant="acme")
    with pytest.raises(TypeError, match="missing parameters: none; unknown parameters: offset"):
        PAGE.args(tenant="acme", limit=10, offset=0)
    with pytest.raises(TypeError, match="unknown parameters: tenant"):
        Query("none", "SELECT 1", ())(tenant="acme")
    # a real statement, as the store calls it
    with pytest.raises(TypeError, match="statement reserve: missing parameters: worker_id"):
        QUERIES["reserve"](
            partitions=[0],
            candidates=[1],
            floors=[None],
            caps=None,
            apart=None,
            limit=1,
            lease_grace_seconds=1.0,
            worker="w",
            lookahead_seconds=1.0,
            tenant_ceiling=None,
        )


# --- queries.sql and its callers (static) -------------------------------------


def _blocks() -> dict[str, str]:
    """Each named block of queries.sql, comments included."""
    text = resources.files("hooklane.store").joinpath("queries.sql").read_text()
    parts = re.split(r"^-- name: (\w+)\s*$", text, flags=re.MULTILINE)
    return dict(zip(parts[1::2], parts[2::2], strict=True))


def test_every_statement_converts_and_its_comment_names_each_parameter():
    blocks = _blocks()
    assert set(blocks) == set(QUERIES) and len(QUERIES) > 30
    for name, query in QUERIES.items():
        comment = "\n".join(line for line in blocks[name].splitlines() if line.startswith("--"))
        assert not re.search(r"\$\d", comment), f"{name}: its comment still numbers a parameter"
        unnamed = [p for p in query.params if not re.search(rf"\b{p}\b", comment)]
        assert not unnamed, f"{name}: its comment does not name {unnamed}"
        if not query.params:
            assert "Parameters: none" in comment, f"{name}: say that it takes no parameters"


def _calls() -> list[tuple[str, str, set[str], bool]]:
    """Every statement the store modules call: (where, statement, keyword
    names given, whether a ``**mapping`` gives more)."""
    found = []
    for path in sorted(STORE.glob("*.py")):
        tree = ast.parse(path.read_text())
        parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name)):
                continue
            if node.value.id != "QUERIES":
                continue
            assert isinstance(node.slice, ast.Constant), f"{path.name}:{node.lineno}: a statement by its name"
            where = f"{path.name}:{node.lineno}"
            call = parents[node]
            if isinstance(call, ast.Assign):
                # `publish = QUERIES["publish"]`, then `publish.args(...)`
                (target,) = call.targets
                assert isinstance(target, ast.Name)
                uses = [
                    n
                    for n in ast.walk(tree)
                    if isinstance(n, ast.Attribute)
                    and isinstance(n.value, ast.Name)
                    and n.value.id == target.id
                    and n.attr == "args"
                ]
                assert uses, f"{where}: {target.id} is never called with .args"
                calls = [parents[u] for u in uses]
            elif isinstance(call, ast.Attribute) and call.attr == "args":
                calls = [parents[call]]
            else:
                calls = [call]
            for c in calls:
                assert isinstance(c, ast.Call), f"{where}: call the statement with its parameters"
                names = {k.arg for k in c.keywords if k.arg is not None}
                found.append((where, node.slice.value, names, any(k.arg is None for k in c.keywords)))
    return found


def test_every_call_in_the_store_passes_exactly_the_statements_names_and_every_statement_is_called():
    calls = _calls()
    assert len(calls) > 30, "no calls found: has the calling convention changed?"
    for where, statement, names, more in calls:
        assert statement in QUERIES, f"{where}: no statement {statement} in queries.sql"
        params = set(QUERIES[statement].params)
        assert names <= params, f"{where}: {statement} takes no {sorted(names - params)}"
        assert more or names == params, f"{where}: {statement} also needs {sorted(params - names)}"
    assert not set(QUERIES) - {statement for _, statement, _, _ in calls}, "statements nothing calls"


# --- against Postgres ----------------------------------------------------------

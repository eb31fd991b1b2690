"""The user documentation cannot drift from the code: the settings and their
defaults, the command lines, the metric names, the SQL statements and
functions the state machines name, and the links between the pages. Each
documented subcommand run: tests/processes/test_docs.py."""

from __future__ import annotations

import contextlib
import dataclasses
import io
import os
import re
import shlex
import socket
from pathlib import Path
from typing import Any

import pytest

from hooklane import cli
from hooklane.operator import main as operator_main
from hooklane.settings import _NESTED, _TOOLING, Settings, _variable
from hooklane.tokens import Tokens
from testsupport.docs import DOCS, PAGES, ROOT, documented_commands, read, subcommand_path

QUERIES = ROOT / "hooklane" / "store" / "queries.sql"
MIGRATIONS = ROOT / "hooklane" / "store" / "migrations"

# Defaults the code computes at start, as configuration.md writes them.
_COMPUTED = {"<hostname>": socket.gethostname(), "<pid>": str(os.getpid())}


# --- configuration.md -------------------------------------------------------


def _settings_defaults() -> dict[str, Any]:
    """Every variable Settings reads, with its default as the code has it."""
    defaults: dict[str, Any] = {}
    for f in dataclasses.fields(Settings):
        nested = _NESTED.get(f.name)
        if nested is not None:
            for g in dataclasses.fields(nested):
                defaults[_variable(f.name, g.name)] = g.default
        elif f.default_factory is not dataclasses.MISSING:
            defaults[_variable(f.name)] = f.default_factory()
        else:
            defaults[_variable(f.name)] = f.default
    return defaults


def _shown(value: Any) -> str:
    """A default the way configuration.md writes it."""
    if value is None or value in ("", ()) or (isinstance(value, Tokens) and not len(value)):
        return "unset"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


def _table_rows(text: str) -> dict[str, list[str]]:
    """Rows of the markdown tables whose first cell is a `HOOKLANE_*` name."""
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and re.fullmatch(r"`HOOKLANE_[A-Z0-9_]+`", cells[0]):
            rows[cells[0].strip("`")] = cells
    return rows


def test_every_setting_is_documented_with_its_default():
    rows = _table_rows(read(DOCS / "configuration.md"))
    missing = sorted(set(_settings_defaults()) - set(rows))
    assert not missing, f"settings not in docs/configuration.md: {missing}"
    wrong = {}
    for name, default in _settings_defaults().items():
        written = rows[name][2].strip("`")
        for placeholder, value in _COMPUTED.items():
            written = written.replace(placeholder, value)
        if written != _shown(default):
            wrong[name] = (rows[name][2], _shown(default))
    assert not wrong, f"documented default != code default: {wrong}"


def test_every_variable_the_configuration_names_exists():
    known = set(_settings_defaults())
    text = read(DOCS / "configuration.md")
    unknown = set()
    for match in re.finditer(r"HOOKLANE_[A-Z0-9_]*[A-Z0-9](_\*)?", text):
        name = match.group(0)
        if name.endswith("_*"):
            # a group: HOOKLANE_RETRY_* names the retry policy's variables
            prefix = name[:-1]
            if not any(k.startswith(prefix) for k in known) and not prefix.startswith(_TOOLING):
                unknown.add(name)
        elif name not in known and not (name + "_").startswith(_TOOLING):
            unknown.add(name)
    assert not unknown, f"docs/configuration.md names variables that are not settings: {sorted(unknown)}"


# --- command lines ----------------------------------------------------------


def _parse_error(args: list[str]) -> str | None:
    """What the real parsers say about a complete command line, or None."""
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr), contextlib.redirect_stdout(io.StringIO()):
            parsed, rest = cli._parser().parse_known_args(args)
            if (parsed.command, getattr(parsed, "dev_command", None)) not in cli._PASS_THROUGH and rest:
                return f"unrecognized arguments: {' '.join(rest)}"
            if parsed.command == "operator":
                operator_main._parser().parse_args(rest)
    except SystemExit as exc:
        return stderr.getvalue().strip() or f"exit status {exc.code}"
    return None


def test_the_docs_show_command_lines():
    commands = documented_commands()
    paths = {subcommand_path(args) for _, args, _ in commands}
    # what the runbooks rely on is found at all
    assert {("status",), ("endpoint", "reactivate"), ("endpoint", "resend"), ("migrate",)} <= paths


def test_every_documented_command_line_parses():
    errors = []
    for page, args, complete in documented_commands():
        try:
            subcommand_path(args)
        except ValueError as exc:
            errors.append(f"{page}: {exc}")
            continue
        error = _parse_error(args) if complete else None
        if error:
            errors.append(f"{page}: hooklane {shlex.join(args)}: {error}")
    assert not errors, "\n".join(errors)


# --- metrics ----------------------------------------------------------------

_HISTOGRAM_SERIES = ("_bucket", "_sum", "_count")


def _defined_metrics() -> dict[str, str]:
    """Name -> type of every metric hooklane/metrics.py defines."""
    source = read(ROOT / "hooklane" / "metrics.py")
    return {
        name: kind.lower() for kind, name in re.findall(r"\b(Counter|Gauge|Histogram)\(\s*\"(\w+)\"", source)
    }


def test_operations_names_every_metric_and_no_other():
    defined = _defined_metrics()
    assert len(defined) >= 10, "the pattern no longer finds the metrics in hooklane/metrics.py"
    named = set()
    for token in re.findall(r"\bhooklane_[a-z0-9_]*[a-z0-9]", read(DOCS / "operations.md")):
        for suffix in _HISTOGRAM_SERIES:
            base = token.removesuffix(suffix)
            if base != token and defined.get(base) == "histogram":
                token = base
        named.add(token)
    assert not named - set(defined), (
        f"docs/operations.md names metrics that do not exist: {named - set(defined)}"
    )
    assert not set(defined) - named, f"metrics missing from docs/operations.md: {set(defined) - named}"


# --- state-machine.md -------------------------------------------------------

# A statement changes a state, queues a delivery, or keeps the ready list.
_TRANSITION = re.compile(
    r"\bSET\s+state\b|INSERT INTO deliveries|hooklane_wake_v2\("
    r"|hooklane_(reserve|complete)\w*\(|DELETE FROM (endpoints|events)\b"
)


def _statements() -> dict[str, str]:
    """Named blocks of queries.sql: name -> text."""
    blocks = re.split(r"^-- name: (\w+)\n", read(QUERIES), flags=re.MULTILINE)
    return dict(zip(blocks[1::2], blocks[2::2], strict=True))


def _sql_functions() -> set[str]:
    # catalogue_check.sql: the function the first catalogue mode that needs
    # PL/Python creates, not a migration (migration 0024).
    paths = [*sorted(MIGRATIONS.glob("*.sql")), MIGRATIONS.parent / "catalogue_check.sql"]
    text = "\n".join(read(path) for path in paths)
    return set(re.findall(r"CREATE\s+(?:OR\s+REPLACE\s+)?FUNCTION\s+(\w+)", text, flags=re.IGNORECASE))


def _linked_statements(text: str) -> set[str]:
    return set(re.findall(r"\[`(\w+)`\]\(\.\./hooklane/store/queries\.sql\)", text))


def test_every_statement_the_state_machines_name_exists():
    text = read(DOCS / "state-machine.md")
    linked = _linked_statements(text)
    statements = _statements()
    assert len(statements) > 20 and linked, "no statements found: has the naming convention changed?"
    assert not linked - set(statements), (
        f"not named blocks of queries.sql: {sorted(linked - set(statements))}"
    )


def test_every_transition_statement_is_in_the_state_machines():
    linked = _linked_statements(read(DOCS / "state-machine.md"))
    transitions = {name for name, sql in _statements().items() if _TRANSITION.search(sql)}
    # publish's transitions are hooklane_try_publish_v1's, which
    # test_every_sql_function_the_state_machines_name_exists finds named.
    assert {"reserve", "complete", "rescue_expired", "resend_dead"} <= transitions
    assert not transitions - linked, (
        f"statements that change a state or the ready list, missing from docs/state-machine.md: "
        f"{sorted(transitions - linked)}"
    )


def test_every_sql_function_the_state_machines_name_exists():
    text = read(DOCS / "state-machine.md")
    functions = _sql_functions()
    called = set(re.findall(r"\b(hooklane_\w+)\(", text))
    assert called and not called - functions, f"no such SQL function: {sorted(called - functions)}"
    sql = read(QUERIES) + "\n".join(read(p) for p in sorted(MIGRATIONS.glob("*.sql")))
    unknown = {t for t in re.findall(r"\bhooklane_\w+", text) if not re.search(rf"\b{t}\b", sql)}
    assert not unknown, f"named in docs/state-machine.md, found in no SQL: {sorted(unknown)}"
    used = {f for f in re.findall(r"\b(hooklane_\w+)\(", read(QUERIES)) if f in functions}
    assert not used - called, (
        f"functions queries.sql calls, missing from docs/state-machine.md: {used - called}"
    )


# The example programs the tests run, by the page that shows them:
# tests/processes/test_publishing_examples.py, tests/processes/test_receiver_catch_up.py.
_SHOWN_EXAMPLES = {
    "publishing.md": ("publishing/go/main.go", "publishing/node/publish.js", "publishing/psql/publish.sql"),
    "receivers.md": ("receivers/catch_up.py",),
}


@pytest.mark.parametrize("doc", sorted(_SHOWN_EXAMPLES))
def test_the_docs_show_each_example_as_it_is_run(doc):
    """Each page shows the example programs the tests run, each whole and
    unchanged."""
    blocks = re.findall(r"^```\w*\n(.*?)^```", read(DOCS / doc), flags=re.MULTILINE | re.DOTALL)
    examples = [ROOT / "examples" / name for name in _SHOWN_EXAMPLES[doc]]
    missing = [str(path.relative_to(ROOT)) for path in examples if read(path) not in blocks]
    assert not missing, f"not shown whole in docs/{doc}: {missing}"


# --- links ------------------------------------------------------------------


def _anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(h) for h in re.findall(r"^#+\s+(.*)$", read(page), flags=re.MULTILINE)}


def test_every_link_between_pages_leads_inside_the_repository():
    broken = []
    for page in PAGES:
        text = re.sub(r"```.*?```", "", read(page), flags=re.DOTALL)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, fragment = target.partition("#")
            resolved = (page.parent / path).resolve() if path else page
            if not resolved.is_relative_to(ROOT):
                broken.append(f"{page.name}: {target} leads outside the repository")
            elif not resolved.exists():
                broken.append(f"{page.name}: {target} does not exist")
            elif fragment and resolved.suffix == ".md" and fragment not in _anchors(resolved):
                broken.append(f"{page.name}: {target} has no heading #{fragment}")
    assert not broken, "\n".join(broken)


def test_the_readme_indexes_the_documentation():
    readme = read(ROOT / "README.md")
    index = readme[readme.index("## Documentation") :]
    index = index[: index.find("\n## ", 1)]
    for page in [*sorted(p.name for p in DOCS.glob("*.md")), "CONTRIBUTING.md", "CHANGELOG.md"]:
        assert page in index, f"README's Documentation section does not list {page}"

"""The test tiers, lightest first: each needs what the tiers before it
need, and more. pyproject.toml declares them as markers (one line each on
what the tier needs); CONTRIBUTING.md "Running and testing" gives the
command for each.

Every test is in exactly one tier: its folder's (``tests/<tier>/``, whose
conftest.py says which); a test never names a tier itself, so moving it
is what changes its tier. A test may use the fixtures of its tier and of
lighter ones only. This module, a plugin of every test run (the
repository's conftest.py), checks both at collection; hack/test builds
the Go binaries only for a selection that may hold a tier needing them
(``python3 -m tests.tiers EXPR [PATH...]``).

``chaos`` is no tier: it names the fault-injection tests, whatever their
tier, for ``-m chaos`` or ``-m "not chaos"``.
"""

from __future__ import annotations

import itertools
import re
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import pytest

# pytest's own reading of -m, so that hack/test reads an expression as pytest does.
from _pytest.mark.expression import Expression

TIERS = ("unit", "db", "processes", "browser", "image", "tools", "kube", "cluster")
# The tier of a test's folder, as its conftest.py says (``folder``).
FOLDER = pytest.StashKey[str]()

# The fixtures that start something, each the root of a chain (``db``
# needs ``dsn``, which needs ``postgresql``), by the tier that provides
# it. pytest-postgresql's factories reach the server through
# ``request.getfixturevalue``, out of the closure pytest reads at
# collection: hence their own names here.
FIXTURES = {
    "local_postgres": "db",
    "postgresql": "db",
    "postgresql_noproc": "db",
    "receiver": "db",
    # testsupport/tracing.py: an OTLP/HTTP trace collector on loopback
    "collector": "db",
    # a PostgreSQL of the module's own, which its tests restart
    "chaos_pg": "processes",
    "api_schema": "processes",
    # hack/examples/build: the publishing examples' Go binary and node_modules
    "publishing_examples": "processes",
    "browser": "browser",
    "page": "browser",
    "image": "image",
    # hack/tools/build: helm, the helm-unittest plugin and promtool
    "tools": "tools",
    "control_plane": "kube",
    "restartable_control_plane": "kube",
    "bare_control_plane": "kube",
    "cluster": "cluster",
}

# The Go binaries hack/test builds, by the tiers whose tests use them:
# the kube tests install the chart too (tests/kube/test_chart.py, the
# operator's RBAC), and the cluster's build starts with envtest's. The
# publishing examples (a Go binary and node_modules) are run as processes.
BUILDS = {
    "examples": ("processes",),
    "tools": ("tools", "kube", "cluster"),
    "envtest": ("kube", "cluster"),
    "cluster": ("cluster",),
}


def tier_problems(
    markers: Iterable[str], fixtures: Iterable[str], folder: str | None
) -> tuple[str | None, list[str]]:
    """The tier of a test in the folder of tier ``folder`` (None: in no
    tier's folder), with these markers (its own, its class's and its
    module's) and this fixture closure, and what is wrong with it: no
    folder, a tier marker, or fixtures of a heavier tier."""
    if folder is None:
        return None, ["is in no tier's folder: move it to tests/<tier>/"]
    problems = []
    named = sorted(set(markers).intersection(TIERS), key=TIERS.index)
    if named:
        problems.append(f"is marked {', '.join(named)}: its folder says its tier ({folder})")
    heavier = sorted(
        (TIERS.index(FIXTURES[f]), f)
        for f in set(fixtures)
        if f in FIXTURES and TIERS.index(FIXTURES[f]) > TIERS.index(folder)
    )
    if heavier:
        uses = ", ".join(f"{f} ({TIERS[rank]})" for rank, f in heavier)
        problems.append(f"is in tier {folder} but uses {uses}: move it to tests/{TIERS[heavier[-1][0]]}/")
    return folder, problems


def folder(tier: str) -> Callable[[pytest.Item], None]:
    """The hook a tier folder's conftest.py sets as its
    ``pytest_itemcollected``: pytest calls it for the tests below that
    folder only."""
    assert tier in TIERS, tier

    def pytest_itemcollected(item: pytest.Item) -> None:
        item.stash[FOLDER] = tier

    return pytest_itemcollected


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Every test in its folder's tier, using no fixture of a heavier one.
    First, before -m selects by marker: each test is given its folder's."""
    problems = []
    for item in items:
        marked = {m.name for node in item.listchain() for m in node.own_markers}
        tier, wrong = tier_problems(marked, getattr(item, "fixturenames", ()), item.stash.get(FOLDER, None))
        if tier is not None:
            item.add_marker(tier)
        problems += [f"{item.nodeid} {why}" for why in wrong]
    if problems:
        raise pytest.UsageError("test tiers (tests/tiers.py):\n" + "\n".join(problems))


def pytest_configure(config: pytest.Config) -> None:
    declared = {line.split(":")[0].strip() for line in config.getini("markers")}
    missing = [t for t in TIERS if t not in declared]
    if missing:
        raise pytest.UsageError(f"tiers not declared as markers in pyproject.toml: {', '.join(missing)}")


# What -m may name: pytest's identifiers, less its keywords.
_NAME = re.compile(r"[\w:+\-.\[\]\\/]+")
_KEYWORDS = frozenset({"and", "or", "not"})
# Past this many other names in an expression, every tier counts as
# selected rather than trying each combination of them.
_MOST_NAMES = 8


def _marked(names: set[str]) -> Callable[..., bool]:
    """A matcher for ``Expression.evaluate``: a test marked ``names``."""
    return lambda name, /, **_: name in names


def selected_tiers(expression: str) -> list[str]:
    """The tiers whose tests ``-m expression`` may select: those for which
    some combination of the expression's other names (``chaos``, say)
    makes it true. Every tier for an empty expression."""
    if not expression.strip():
        return list(TIERS)
    try:
        compiled = Expression.compile(expression)
    except (SyntaxError, pytest.UsageError):
        return []  # nothing to build: pytest says what is wrong with it
    others = sorted(set(_NAME.findall(expression)) - _KEYWORDS - set(TIERS))
    if len(others) > _MOST_NAMES:
        return list(TIERS)
    found = []
    for tier in TIERS:
        for values in itertools.product((False, True), repeat=len(others)):
            true = {tier, *(name for name, on in zip(others, values, strict=True) if on)}
            if compiled.evaluate(_marked(true)):
                found.append(tier)
                break
    return found


def path_tiers(path: str) -> set[str]:
    """The tiers of the tests a path given to pytest may hold
    (``tests/db/test_x.py::test_y`` too): its tier folder's; every tier for
    a path above the tier folders."""
    found = Path(path.partition("::")[0])
    below = (
        found.parts[len(found.parts) - found.parts[::-1].index("tests") :] if "tests" in found.parts else ()
    )
    return {below[0]} if below and below[0] in TIERS else set(TIERS)


def builds(expression: str, paths: Iterable[str] = ()) -> list[str]:
    """The Go builds (keys of BUILDS) that ``-m expression`` needs, on the
    tests of ``paths`` (all of them when none is given)."""
    tiers = set(selected_tiers(expression))
    if paths:
        tiers &= set().union(*(path_tiers(p) for p in paths))
    return [build for build, users in BUILDS.items() if tiers.intersection(users)]


if __name__ == "__main__":
    print(" ".join(builds(sys.argv[1] if len(sys.argv) > 1 else "", sys.argv[2:])))

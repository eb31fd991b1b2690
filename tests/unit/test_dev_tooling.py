"""The test tiers (tests/tiers.py): a test is in its folder's, uses nothing
heavier, every tier is declared and every module is in a tier's folder;
and hack/test builds only what the selected tiers need. The dev tooling's
servers and its wheel: tests/processes/test_dev_tooling.py and
tests/kube/test_dev_tooling.py."""

from __future__ import annotations

import tomllib

from tests.tiers import TIERS, builds, tier_problems
from testsupport.dev_tooling import ROOT


def test_a_test_is_in_one_tier_and_uses_nothing_heavier():
    # what pytest collects for a test taking ``db`` and ``receiver``
    closure = ["event_loop_policy", "db", "dsn", "postgresql", "receiver", "request"]
    assert tier_problems(["parametrize"], ["tmp_path", "monkeypatch"], "unit") == ("unit", [])
    assert tier_problems(["chaos"], closure, "db") == ("db", [])
    assert tier_problems([], closure, "unit") == (
        "unit",
        ["is in tier unit but uses postgresql (db), receiver (db): move it to tests/db/"],
    )
    assert tier_problems([], ["tools", *closure], "db") == (
        "db",
        ["is in tier db but uses tools (tools): move it to tests/tools/"],
    )
    assert tier_problems([], ["tools", "control_plane", *closure], "kube") == ("kube", [])
    assert tier_problems(["unit"], [], "db")[1] == ["is marked unit: its folder says its tier (db)"]
    assert tier_problems(["db", "kube"], [], "db")[1] == ["is marked db, kube: its folder says its tier (db)"]
    assert tier_problems(["unit"], [], None) == (None, ["is in no tier's folder: move it to tests/<tier>/"])


def test_hack_test_builds_only_what_the_selected_tiers_need():
    assert builds("") == builds("not chaos") == ["examples", "tools", "envtest", "cluster"]
    for light in ("unit", "unit or db", "db and not chaos"):
        assert builds(light) == [], light
    for processes in ("processes", "not (tools or kube or cluster)"):
        assert builds(processes) == ["examples"], processes
    assert builds("tools") == ["tools"]
    assert builds("kube and chaos") == ["tools", "envtest"]
    assert builds("unit and kube") == []  # no test is in both
    assert builds("((") == []  # pytest says what is wrong with it

    # Paths narrow it: a tier's folder holds its tier's tests only.
    def at(*paths: str) -> list[str]:
        return [str(ROOT / path) for path in paths]

    assert builds("", at("tests/db/test_schema.py::test_x")) == []
    assert builds("", at("tests/processes/test_cli.py")) == ["examples"]
    assert builds("", at("tests/browser/test_dashboard.py")) == []
    assert builds("", at("tests/db/test_schema.py", "tests/kube")) == ["tools", "envtest"]
    assert builds("", at("tests/tools/test_chart.py")) == ["tools"]
    assert builds("unit", at("tests")) == [] and builds("", at("tests")) == builds("")


def test_every_tier_is_declared_in_order_with_what_it_needs():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    names = [line.split(":")[0] for line in markers]
    assert [n for n in names if n != "chaos"] == list(TIERS)
    assert "chaos" in names


def test_every_test_module_is_in_a_tier_folder():
    # What they may import from one another, hack/lint checks (pyproject.toml: importlinter).
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "tiers.py"]
    for folder in (p for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert folder.name in TIERS, folder
        assert f'folder("{folder.name}")' in (folder / "conftest.py").read_text()

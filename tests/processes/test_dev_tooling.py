"""The dev tooling and the test tiers, as processes: a killed dev Postgres
leaves no server behind, the wheel leaves the tooling out and says so, and
collection gives a test its folder's tier and refuses one in the wrong
tier."""

from __future__ import annotations

import shutil
import subprocess
import sys
import sysconfig
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

from testsupport.dev_tooling import ROOT, killed_after_it_printed, wait_gone


def test_a_killed_dev_postgres_leaves_no_server_behind():
    script = "from hooklane.dev.postgres import LocalPostgres\nimport time\npg = LocalPostgres().start()\nprint(pg.dir, flush=True)\ntime.sleep(600)"
    folder, pids = killed_after_it_printed([sys.executable, "-c", script], str)
    assert pids, "postgres was running"
    wait_gone(pids, folder)


def test_collection_gives_a_test_its_folders_tier_and_refuses_one_in_the_wrong_tier(tmp_path):
    for tier in ("unit", "db"):
        (tmp_path / tier).mkdir()
        (tmp_path / tier / "__init__.py").write_text("")
        (tmp_path / tier / "conftest.py").write_text(
            f"from tests.tiers import folder\n\npytest_itemcollected = folder({tier!r})\n"
        )
    (tmp_path / "unit" / "test_tiers.py").write_text("def test_pure():\n    pass\n")
    (tmp_path / "db" / "test_tiers.py").write_text("def test_unmarked(db):\n    pass\n")

    def collect(*args: str) -> subprocess.CompletedProcess[str]:
        # this repository's plugins and configuration, on test files of its own
        options = ["-p", "tests.tiers", "-p", "testsupport.fixtures"]
        options += ["-c", str(ROOT / "pyproject.toml"), "--rootdir", str(tmp_path)]
        return subprocess.run(
            [sys.executable, "-m", "pytest", "--collect-only", "-q", *options, *args, str(tmp_path)],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=120,
        )

    done = collect("-m", "db")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "test_tiers.py::test_unmarked" in done.stdout and "test_pure" not in done.stdout

    (tmp_path / "unit" / "test_wrong.py").write_text(
        "import pytest\n\n\ndef test_wrong(db):\n    pass\n\n\n"
        "@pytest.mark.processes\ndef test_other():\n    pass\n\n\n"
        "@pytest.mark.unit\ndef test_same():\n    pass\n"
    )
    (tmp_path / "unit" / "test_module.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.unit\n\n\ndef test_marked():\n    pass\n"
    )
    (tmp_path / "test_nowhere.py").write_text("def test_nowhere():\n    pass\n")
    done = collect()
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "test_wrong is in tier unit but uses postgresql (db): move it to tests/db/" in done.stderr
    assert "test_other is marked processes: its folder says its tier (unit)" in done.stderr
    assert "test_same is marked unit: its folder says its tier (unit)" in done.stderr
    assert "test_marked is marked unit: its folder says its tier (unit)" in done.stderr
    assert "test_nowhere is in no tier's folder: move it to tests/<tier>/" in done.stderr


def _build_wheel(tmp_path: Path) -> Path:
    """The wheel, built from a copy of what the image is built from
    (.dockerignore's allowlist), plus the egg-info an editable install leaves
    in a checkout: its file list must not bring hooklane/dev back."""
    src = tmp_path / "src"
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(ROOT / name, src)
    for folder in ("hooklane", "hooklane.egg-info"):
        if (ROOT / folder).exists():
            shutil.copytree(ROOT / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--quiet",
            "--wheel-dir",
            str(tmp_path),
            str(src),
        ],
        check=True,
        timeout=300,
    )
    (wheel,) = tmp_path.glob("hooklane-*.whl")
    return wheel


def _venv_with(tmp_path: Path, wheel: Path) -> Path:
    """A virtualenv holding the wheel and nothing else of Hooklane. The
    dependencies come from this interpreter's site-packages, added as a plain
    path: ``--system-site-packages`` would also run the editable install's
    finder, which serves hooklane.dev from the checkout."""
    env = tmp_path / "venv"
    venv.create(env, with_pip=False)
    (site,) = env.glob("lib/python3*/site-packages")
    (site / "deps.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    python = str(env / "bin" / "python")
    install = ["install", "--quiet", "--no-deps", "--no-index", str(wheel)]
    subprocess.run([sys.executable, "-m", "pip", "--python", python, *install], check=True, timeout=120)
    return env


def test_the_wheel_leaves_the_dev_tooling_out_and_says_so(tmp_path):
    wheel = _build_wheel(tmp_path)
    names = zipfile.ZipFile(wheel).namelist()
    assert not [n for n in names if n.startswith("hooklane/dev/")]
    assert "hooklane/store/queries.sql" in names
    assert [n for n in names if n.startswith("hooklane/store/migrations/0001_")]

    env = _venv_with(tmp_path, wheel)
    run = {"cwd": tmp_path, "capture_output": True, "text": True, "timeout": 60}
    where = subprocess.run([env / "bin" / "python", "-c", "import hooklane; print(hooklane.__file__)"], **run)
    assert where.stdout.startswith(str(env)), where
    for tool in ("demo", "postgres", "controlplane"):
        done = subprocess.run([env / "bin" / "hooklane", "dev", tool], **run)
        assert (done.returncode, done.stdout) == (2, ""), done
        assert done.stderr == (
            "hooklane: `hooklane dev` needs a source checkout (clone the repository, then pip install -e .)\n"
        )
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    shown = subprocess.run([env / "bin" / "hooklane", "--version"], **run)
    assert shown.stdout == f"hooklane {version}\n"

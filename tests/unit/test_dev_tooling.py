"""The dev tooling: its servers never outlive it, however it ends; it stays
out of the wheel, which says so; and the unit tier admits no server."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import sysconfig
import time
import tomllib
import venv
import zipfile
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.tiers import TIERS, builds, tier_problems


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for init to reap it runs nothing
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def _pids_under(folder: str) -> list[int]:
    """Processes whose command line names ``folder``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if folder.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def _wait_gone(pids: list[int], folder: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(_alive(p) for p in pids) and not Path(folder).exists():
            return
        time.sleep(0.2)
    raise AssertionError(
        f"still running: {[p for p in pids if _alive(p)]}, folder kept: {Path(folder).exists()}"
    )


def _killed_after_it_printed(argv: list[str], folder_of: Callable[[str], str]) -> tuple[str, list[int]]:
    """Run ``argv`` until it prints the path of its servers' folder (as
    ``folder_of`` reads it from the first line), note the processes running
    from that folder, then SIGKILL it. Returns the folder and those pids."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        folder = folder_of(proc.stdout.readline().strip())
        assert folder.startswith("/"), folder
        pids = _pids_under(folder)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return folder, pids


@pytest.mark.processes
def test_a_killed_dev_postgres_leaves_no_server_behind():
    script = "from hooklane.dev.postgres import LocalPostgres\nimport time\npg = LocalPostgres().start()\nprint(pg.dir, flush=True)\ntime.sleep(600)"
    folder, pids = _killed_after_it_printed([sys.executable, "-c", script], str)
    assert pids, "postgres was running"
    _wait_gone(pids, folder)


@pytest.mark.kube
def test_a_killed_dev_controlplane_leaves_no_apiserver_behind():
    folder, pids = _killed_after_it_printed(
        [sys.executable, "-m", "hooklane.dev.controlplane"], lambda kubeconfig: str(Path(kubeconfig).parent)
    )
    assert pids, "etcd and kube-apiserver were running"
    _wait_gone(pids, folder)


def test_a_test_is_in_one_tier_and_uses_nothing_heavier():
    # what pytest collects for a test taking ``db`` and ``receiver``
    closure = ["event_loop_policy", "db", "dsn", "postgresql", "receiver", "request"]
    assert tier_problems(["unit", "parametrize"], ["tmp_path", "monkeypatch"], "db") == ("unit", [])
    assert tier_problems(["chaos"], closure, "db") == ("db", [])
    assert tier_problems(["unit"], closure, "db") == (
        "unit",
        ["is in tier unit but uses postgresql (db), receiver (db): mark it db"],
    )
    assert tier_problems([], ["tools", *closure], "db") == (
        "db",
        ["is in tier db but uses tools (tools): mark it tools"],
    )
    assert tier_problems(["kube"], ["tools", "control_plane", *closure], "unit") == ("kube", [])
    assert tier_problems(["unit", "kube"], [], "unit")[1] == ["is in 2 tiers (unit, kube): one only"]
    assert tier_problems([], [], None) == (None, ["is in no tier's folder: move it to tests/<tier>/"])


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

    # Paths narrow it: a tier's folder holds its tier's tests and those its
    # modules mark with another.
    def at(*paths: str) -> list[str]:
        return [str(ROOT / path) for path in paths]

    assert builds("", at("tests/db/test_schema.py::test_x")) == []
    assert builds("", at("tests/processes/test_cli.py")) == ["examples"]
    assert builds("not browser", at("tests/unit/test_dashboard.py")) == []
    assert builds("", at("tests/db/test_schema.py", "tests/kube")) == ["tools", "envtest"]
    assert builds("", at("tests/tools/test_chart.py")) == ["tools", "envtest"]  # and two kube tests
    assert builds("unit", at("tests")) == [] and builds("", at("tests")) == builds("")


def test_every_tier_is_declared_in_order_with_what_it_needs():
    markers = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]["markers"]
    names = [line.split(":")[0] for line in markers]
    assert [n for n in names if n != "chaos"] == list(TIERS)
    assert "chaos" in names


@pytest.mark.processes
def test_collection_gives_a_test_its_folders_tier_and_refuses_one_in_the_wrong_tier(tmp_path):
    for tier in ("unit", "db"):
        (tmp_path / tier).mkdir()
        (tmp_path / tier / "__init__.py").write_text("")
        (tmp_path / tier / "conftest.py").write_text(
            f"from tests.tiers import folder\n\npytest_itemcollected = folder({tier!r})\n"
        )
    (tmp_path / "db" / "test_tiers.py").write_text(
        "import pytest\n\n\n"
        "@pytest.mark.unit\ndef test_pure():\n    pass\n\n\n"
        "def test_unmarked(db):\n    pass\n"
    )

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
        "@pytest.mark.unit\n@pytest.mark.processes\ndef test_twice():\n    pass\n"
    )
    (tmp_path / "unit" / "test_module.py").write_text(
        "import pytest\n\npytestmark = pytest.mark.unit\n\n\ndef test_marked():\n    pass\n"
    )
    (tmp_path / "test_nowhere.py").write_text("def test_nowhere():\n    pass\n")
    done = collect()
    assert done.returncode == pytest.ExitCode.USAGE_ERROR, done.stdout + done.stderr
    assert "test_wrong is in tier unit but uses postgresql (db): mark it db" in done.stderr
    assert "test_twice is in 2 tiers (unit, processes): one only" in done.stderr
    assert "test_marked is in a module marked unit: its folder says its tier" in done.stderr
    assert "test_nowhere is in no tier's folder: move it to tests/<tier>/" in done.stderr


def test_every_test_module_is_in_a_tier_folder():
    # What they may import from one another, hack/lint checks (pyproject.toml: importlinter).
    tests = ROOT / "tests"
    assert sorted(p.name for p in tests.glob("*.py")) == ["__init__.py", "tiers.py"]
    for folder in (p for p in tests.iterdir() if p.is_dir() and p.name != "__pycache__"):
        assert folder.name in TIERS, folder
        assert f'folder("{folder.name}")' in (folder / "conftest.py").read_text()


ROOT = Path(__file__).resolve().parents[2]


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


@pytest.mark.processes
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

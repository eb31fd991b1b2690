"""The dev tooling's servers never outlive it, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest


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
    raise AssertionError(f"still running: {[p for p in pids if _alive(p)]}, folder kept: {Path(folder).exists()}")


def _killed_after_it_printed(argv: list[str], last_line: str) -> str:
    """Run ``argv`` until it prints a line starting with ``last_line``'s
    prefix, SIGKILL it, and return that line."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        line = proc.stdout.readline().strip()
        assert line.startswith(last_line), line
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return line


def test_a_killed_dev_postgres_leaves_no_server_behind():
    script = "from hooklane.dev.postgres import LocalPostgres\nimport time\npg = LocalPostgres().start()\nprint(pg.dir, flush=True)\ntime.sleep(600)"
    folder = _killed_after_it_printed([sys.executable, "-c", script], "/")
    _wait_gone(_pids_under(folder), folder)


@pytest.mark.kube
def test_a_killed_dev_controlplane_leaves_no_apiserver_behind():
    kubeconfig = _killed_after_it_printed([sys.executable, "-m", "hooklane.dev.controlplane"], "/")
    folder = str(Path(kubeconfig).parent)
    pids = _pids_under(folder)
    assert pids, "etcd and kube-apiserver were running"
    _wait_gone(pids, folder)

"""The dev tooling's servers never outlive it, however it ends."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
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

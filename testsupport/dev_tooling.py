"""What tests/kube/test_dev_tooling.py, tests/processes/test_dev_tooling.py
and tests/unit/test_dev_tooling.py share."""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # a zombie waiting for init to reap it runs nothing
    return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def pids_under(folder: str) -> list[int]:
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


def wait_gone(pids: list[int], folder: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(alive(p) for p in pids) and not Path(folder).exists():
            return
        time.sleep(0.2)
    raise AssertionError(
        f"still running: {[p for p in pids if alive(p)]}, folder kept: {Path(folder).exists()}"
    )


def killed_after_it_printed(argv: list[str], folder_of: Callable[[str], str]) -> tuple[str, list[int]]:
    """Run ``argv`` until it prints the path of its servers' folder (as
    ``folder_of`` reads it from the first line), note the processes running
    from that folder, then SIGKILL it. Returns the folder and those pids."""
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        folder = folder_of(proc.stdout.readline().strip())
        assert folder.startswith("/"), folder
        pids = pids_under(folder)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    return folder, pids


ROOT = Path(__file__).resolve().parents[1]

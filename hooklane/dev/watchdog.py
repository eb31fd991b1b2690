"""Cleanup that runs when the dev tooling's process ends, however it ends.

Servers started for a demo or a test run in sessions of their own, so a
terminal's Ctrl-C reaches only us and we stop them in order. The price is
that nothing stops them when we are killed outright (SIGKILL, the OOM killer,
a CI timeout). A watchdog is a tiny shell process blocked reading a pipe
whose only writer is this process: the kernel closes that pipe when we exit,
for any reason, and the watchdog then runs its cleanup. Unlike a parent-death
signal, it does not depend on which thread started the server.
"""

from __future__ import annotations

import subprocess


class Watchdog:
    """``Watchdog(script, *args)``: run ``sh -c script`` with ``args`` as
    ``$0 $1 ...`` once this process has exited. ``disarm()`` when the cleanup
    was done in order, so that it never runs on stale process ids."""

    def __init__(self, script: str, *args: str) -> None:
        self._proc = subprocess.Popen(
            ["sh", "-c", f"cat >/dev/null; {script}", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            # Its own session: the Ctrl-C that interrupts us must not kill
            # the watchdog before we had a chance to clean up in order.
            start_new_session=True,
        )

    def disarm(self) -> None:
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        if self._proc.stdin is not None:
            self._proc.stdin.close()

"""The ``hooklane`` command as a process, as a test runs it."""

from __future__ import annotations

import os
import subprocess
import sys

from testsupport.fixtures import LOOPBACK


def hooklane(dsn: str, *args: str, stdin: str | None = None, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hooklane.cli", *args],
        env={**os.environ, "HOOKLANE_DATABASE_URL": dsn, "HOOKLANE_ALLOWED_NETWORKS": LOOPBACK, **env},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
    )

"""Every subcommand the documentation names runs with ``--help``."""

from __future__ import annotations

import subprocess
import sys

from testsupport.docs import ROOT, documented_commands, subcommand_path


def test_every_documented_subcommand_runs_with_help():
    paths = sorted({subcommand_path(args) for _, args, _ in documented_commands()} - {()})
    failed = []
    for path in paths:
        result = subprocess.run(
            [sys.executable, "-m", "hooklane.cli", *path, "--help"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
        if result.returncode != 0 or "usage: hooklane" not in result.stdout:
            failed.append(
                f"hooklane {' '.join(path)} --help: exit {result.returncode}: {result.stderr[-300:]}"
            )
    assert not failed, "\n".join(failed)

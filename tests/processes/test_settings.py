"""A process refuses to start on a bad setting, naming its variable."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest


@pytest.mark.parametrize(
    "command, variable",
    [
        (["worker"], "HOOKLANE_POLL_SECONDS"),
        # Settings' bound is the operator's only check of its interval.
        (["operator", "-A", "--standalone"], "HOOKLANE_OPERATOR_STATUS_SECONDS"),
    ],
)
def test_a_process_refuses_to_start_on_a_bad_setting(command, variable):
    env = {**os.environ, "HOOKLANE_DATABASE_URL": "postgresql://127.0.0.1:1/x", variable: "0"}
    done = subprocess.run(
        [sys.executable, "-m", "hooklane.cli", *command], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2
    assert (
        done.stderr.strip().splitlines()[-1]
        == f"hooklane: {variable}: input should be greater than 0, not '0'"
    )

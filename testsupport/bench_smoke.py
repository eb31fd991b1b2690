"""What tests/kube/test_bench_smoke.py and
tests/processes/test_bench_smoke.py share."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def server_dsn(pg_server) -> str:
    """The benchmarks create (and drop) their own databases on this server."""
    return f"postgresql://{pg_server.user}@{pg_server.host}:{pg_server.port}/postgres"


def run_bench(module: str, tmp_path: Path, *args: str, timeout: float = 60) -> dict:
    out = tmp_path / f"{module}.json"
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{module}", "--preset", "smoke", "--json", str(out), *args],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())

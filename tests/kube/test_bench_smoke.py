"""The operator's scale benchmark's smoke preset, run as the README runs it
(a subprocess) against the envtest control plane, so that it cannot rot."""

from __future__ import annotations

from pathlib import Path

from testsupport.bench_smoke import run_bench

# From docs/benchmarks.md section 8: an idle operator grows by 39 KB per
# resource at 1,000 and 17 KB at 10,000; the tree before this bound held
# 115 KB at 1,000, and the one before the status pass 139 KB. The smoke
# preset creates its 500 resources 50 at a time, each batch once the last
# is stored (46 KB per resource measured): a backlog's peak, which Python
# keeps, made the figure swing from 67 to 117 KB between runs otherwise.
MAX_KB_PER_RESOURCE = 100


def test_scale_smoke_idle_operator_memory_per_resource(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("scale", tmp_path, "--dsn", server_dsn, "--log-dir", str(tmp_path), timeout=240)
    assert result["idle"]["kb_per_resource"] < MAX_KB_PER_RESOURCE, result["idle"]
    # Nothing changed, so nothing is written.
    assert result["idle"]["writes_per_second"].get("PATCH", 0) == 0, result["idle"]
    assert result["restart"]["status_current_seconds"] > 0

"""Endpoint statistics are stale by autovacuum's rule."""

from __future__ import annotations

from hooklane.store.endpoints import statistics_stale


def test_endpoint_statistics_are_stale_by_autovacuums_rule():
    assert statistics_stale(changed=10_000, rows=0)  # never analysed
    assert not statistics_stale(changed=50, rows=0)
    assert statistics_stale(changed=1_051, rows=10_000)
    assert not statistics_stale(changed=1_050, rows=10_000)

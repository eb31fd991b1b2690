"""The worker's per-endpoint gauges, bounded (HOOKLANE_METRICS_ENDPOINTS):
a real worker on real Postgres exports the series of the most delayed and
the most dead endpoints only, every endpoint's, or per-tenant sums."""

from __future__ import annotations

import asyncpg
import pytest
from prometheus_client import REGISTRY

import hooklane
from hooklane.settings import Settings
from testsupport.fixtures import add_endpoint, wait_for


def _series(name: str) -> dict[tuple[str, ...], float]:
    found = {}
    for family in REGISTRY.collect():
        for sample in family.samples:
            if sample.name == name:
                found[tuple(sample.labels.values())] = sample.value
    return found


async def _twelve(db: asyncpg.Connection) -> None:
    """Twelve endpoints of two tenants that never come due: ep-00..ep-05
    pending, ep-00 the oldest; ep-06..ep-08 with dead deliveries, ep-08 the
    most; the rest idle."""
    for i in range(12):
        await add_endpoint(db, f"ep-{i:02d}", "http://127.0.0.1:9/x", tenant=("acme", "globex")[i % 2])
    for tenant in ("acme", "globex"):
        for n in range(3):
            await hooklane.publish(db, tenant=tenant, type="t.x", data={}, id=f"{tenant}-{n}")
    await db.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'")
    await db.execute(
        """UPDATE deliveries d SET created_at = now() - (100 - substr(ep.name, 4)::int) * interval '1 minute',
                  state = CASE WHEN ep.name BETWEEN 'ep-06' AND 'ep-08'
                                    AND substr(d.event_id, length(d.event_id))::int <= substr(ep.name, 4)::int - 6
                               THEN 'dead' ELSE d.state END
           FROM endpoints ep WHERE ep.id = d.endpoint_id"""
    )
    await db.execute(
        "DELETE FROM deliveries d USING endpoints ep WHERE ep.id = d.endpoint_id "
        "AND ep.name >= 'ep-06' AND d.state = 'pending'"
    )


@pytest.mark.parametrize(
    ("mode", "top", "ages", "dead"),
    [
        ("top", 2, {"ep-00", "ep-01"}, {"ep-08", "ep-07"}),
        ("top", 100, {f"ep-{i:02d}" for i in range(6)}, {"ep-06", "ep-07", "ep-08"}),
    ],
)
async def test_a_worker_exports_the_most_delayed_and_the_most_dead(
    db: asyncpg.Connection, start_worker, settings: Settings, mode, top, ages, dead
):
    await _twelve(db)
    start_worker(metrics_endpoints=mode, metrics_endpoints_top=top, gauges_seconds=0.2)
    exported = ages | dead

    def seen() -> tuple[set[str], set[str]]:
        return (
            {n for (_, n) in _series("hooklane_endpoint_oldest_pending_age_seconds")},
            {n for (_, n), v in _series("hooklane_endpoint_dead_deliveries").items() if v},
        )

    await wait_for(lambda: seen() == (exported, dead))
    assert {n for (_, n) in _series("hooklane_endpoint_pending")} == exported
    assert _series("hooklane_endpoint_dead_deliveries")[("default", "ep-08")] == 3
    assert _series("hooklane_endpoints_exported") == {("exported",): len(exported), ("owned",): 12}
    assert _series("hooklane_tenant_pending") == {}


async def test_all_exports_every_endpoint_and_tenant_sums_per_tenant(
    db: asyncpg.Connection, start_worker, settings: Settings
):
    await _twelve(db)
    worker = start_worker(metrics_endpoints="all", gauges_seconds=0.2)
    await wait_for(lambda: len(_series("hooklane_endpoint_pending")) == 12)
    await worker.stop()

    start_worker(metrics_endpoints="tenant", gauges_seconds=0.2)
    await wait_for(lambda: _series("hooklane_tenant_pending") == {("acme",): 9, ("globex",): 9})
    assert _series("hooklane_endpoint_pending") == {}
    assert _series("hooklane_tenant_dead_deliveries") == {("acme",): 4, ("globex",): 2}
    ages = _series("hooklane_tenant_oldest_pending_age_seconds")
    # ep-00 (acme) waits 100 minutes, ep-01 (globex) 99.
    assert 5990 < ages[("acme",)] < 6100 and 5930 < ages[("globex",)] < 6040

"""The admin API and the worker's gauges, as processes: ``hooklane status``
and the gauges agree."""

from __future__ import annotations

from typing import Any

import hooklane
from hooklane import metrics
from testsupport.api_admin import call, kill
from testsupport.cli import hooklane as run_cli
from testsupport.fixtures import add_endpoint, wait_for


async def test_api_status_and_gauges_agree(api, db, dsn, start_worker):
    """The same endpoints, in every state, seen by the admin API, `hooklane
    status` and the worker's gauges: one health function, so one answer."""
    names = ("active", "manual", "circuit", "probing", "deactivated")
    for name in names:
        await add_endpoint(db, name, "http://127.0.0.1:9/never", paused=name == "manual")
    for i, name in enumerate(names):
        for j in range(i + 1):
            await hooklane.publish(db, tenant="acme", type="t.x", data={}, id=f"{name}-{j}")
    # Each endpoint got every event; keep i+1 pending on endpoint i, kill one
    # more, and let none come due, so that the worker only reads.
    await db.execute(
        "DELETE FROM deliveries d USING endpoints ep WHERE ep.id = d.endpoint_id "
        "AND NOT starts_with(d.event_id, ep.name || '-')"
    )
    await db.execute("UPDATE deliveries SET next_attempt_at = now() + interval '1 hour'")
    first = await db.fetch(
        "SELECT min(id) AS id FROM deliveries WHERE event_id <> 'active-0' GROUP BY endpoint_id"
    )
    await kill(db, [r["id"] for r in first])
    await db.execute(
        """UPDATE endpoints SET consecutive_failures = 20, failing_since = now(),
                  paused_until = now() + CASE name WHEN 'circuit' THEN interval '1 hour'
                                                   ELSE interval '-1 minute' END
           WHERE name IN ('circuit', 'probing')"""
    )
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE name = 'deactivated'")

    seen = {e["name"]: e for e in (await call(api, "GET", "/v1/admin/endpoints"))["endpoints"]}
    expected = {
        "active": ("Active", None, 1, 0),
        "manual": ("Paused", "manual", 1, 1),
        "circuit": ("Paused", "circuit", 2, 1),
        "probing": ("Probing", None, 3, 1),
        "deactivated": ("Deactivated", None, 4, 1),
    }
    assert {n: (e["phase"], e["paused_by"], e["pending"], e["dead"]) for n, e in seen.items()} == expected

    lines = run_cli(dsn, "status").stdout.splitlines()
    header = lines[0]
    for name, (phase, paused_by, pending, dead) in expected.items():
        (line,) = [line for line in lines[1:] if line.startswith(f"default/{name} ")]
        state = f"{phase} ({paused_by})" if paused_by else phase
        assert line[header.index("STATE") :].startswith(state), line
        assert line[header.index("PENDING") :].split()[0] == str(pending)
        assert line[header.index("DEAD") :].split()[0] == str(dead)

    start_worker()

    def gauges() -> dict[str, Any]:
        return {
            "paused": {
                r: metrics.ENDPOINTS_PAUSED.labels(r)._value.get()
                for r in ("manual", "circuit", "deactivated")
            },
            "probing": metrics.ENDPOINTS_PROBING._value.get(),
            "pending": {n: metrics.ENDPOINT_PENDING.labels("default", n)._value.get() for n in names},
            "dead": {n: metrics.ENDPOINT_DEAD.labels("default", n)._value.get() for n in names},
        }

    await wait_for(
        lambda: (
            gauges()
            == {
                "paused": {"manual": 1, "circuit": 1, "deactivated": 1},
                "probing": 1,
                "pending": {n: float(e[2]) for n, e in expected.items()},
                "dead": {n: float(e[3]) for n, e in expected.items()},
            }
        )
    )

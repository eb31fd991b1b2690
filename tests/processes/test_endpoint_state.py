"""One endpoint state, shown alike by the CLI, the operator's phase and the
worker's gauges for the same rows."""

from __future__ import annotations

from datetime import UTC, datetime

from hooklane import metrics, store
from hooklane.operator import reflect
from testsupport.cli import hooklane
from testsupport.fixtures import add_endpoint, wait_for


async def test_cli_operator_and_gauges_agree(dsn, db, start_worker):
    # Nothing is published: no delivery goes out, and the worker only reads.
    for name in ("active", "manual", "circuit", "probing", "deactivated"):
        await add_endpoint(db, name, "http://127.0.0.1:9/never", paused=name == "manual")
    # The circuit's columns as `complete` leaves them, with nothing pending,
    # so the worker leaves them be.
    await db.execute(
        """UPDATE endpoints SET consecutive_failures = 20, failing_since = now(),
                  paused_until = now() + CASE name WHEN 'circuit' THEN interval '1 hour'
                                                   ELSE interval '-1 minute' END
           WHERE name IN ('circuit', 'probing')"""
    )
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE name = 'deactivated'")
    expected = {
        "active": "Active",
        "manual": "Paused (manual)",
        "circuit": "Paused (circuit)",
        "probing": "Probing",
        "deactivated": "Deactivated",
    }

    for command in (["status"], ["endpoint", "list"]):
        lines = hooklane(dsn, *command).stdout.splitlines()[1:]
        # `status` names an endpoint NAMESPACE/NAME, `endpoint list` in two columns.
        shown = {
            name: next(line for line in lines if {name, f"default/{name}"} & set(line.split()[:2]))
            for name in expected
        }
        for name, state in expected.items():
            assert f"  {state}  " in shown[name], (command, shown[name])

    now = datetime.now(UTC)
    phases = {
        h.name: reflect.reflect(
            previous={}, queue=reflect.Queue.from_health(h), synced=None, now=now, age_resolution=10
        ).patch["phase"]
        for h in await store.endpoint_health(db)
    }
    assert phases == {name: state.split()[0] for name, state in expected.items()}

    start_worker()

    def gauges() -> dict[str, float]:
        paused = {
            r: metrics.ENDPOINTS_PAUSED.labels(r)._value.get() for r in ("manual", "circuit", "deactivated")
        }
        return {**paused, "probing": metrics.ENDPOINTS_PROBING._value.get()}

    await wait_for(lambda: gauges() == {"manual": 1, "circuit": 1, "deactivated": 1, "probing": 1})

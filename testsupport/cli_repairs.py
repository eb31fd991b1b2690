"""What tests/db/test_cli_repairs.py and tests/processes/test_cli_repairs.py
share."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import hooklane
from hooklane import store
from testsupport.fixtures import add_endpoint


async def published_while_a_was_deactivated(db, url: str) -> str:
    """Endpoint a (tenant acme, order.* only) deactivated while acme
    published two order events and an invoice, and globex an order; then
    reactivated. Returns a time from before them all."""
    since = (datetime.now(UTC) - timedelta(seconds=1)).isoformat()
    await add_endpoint(db, "a", url, event_types=("order.*",))
    await add_endpoint(db, "globex", "http://127.0.0.1:9/globex", tenant="globex")
    await db.execute("UPDATE endpoints SET state = 'deactivated' WHERE name = 'a'")
    await hooklane.publish(db, tenant="acme", type="order.created", data={}, id="o1")
    await hooklane.publish(db, tenant="acme", type="invoice.paid", data={}, id="i1")
    await hooklane.publish(db, tenant="acme", type="order.paid", data={}, id="o2")
    await hooklane.publish(db, tenant="globex", type="order.created", data={}, id="g1")
    # publish skipped a: it has no delivery of any of them
    assert (
        await db.fetchval(
            "SELECT count(*) FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id WHERE ep.name = 'a'"
        )
        == 0
    )
    assert await store.reactivate_endpoint(db, "default", "a")
    return since

"""End to end: publish, an in-process worker, a real receiver."""

from __future__ import annotations

import json

from standardwebhooks.webhooks import Webhook

import hooklane
from testsupport.fixtures import SECRET, add_endpoint, wait_for
from testsupport.receivers import Answer


async def test_publish_is_delivered_signed(db, receiver, start_worker):
    endpoint_id = await add_endpoint(db, "orders", receiver.on("orders", Answer(204)))
    async with db.transaction():
        event_id = await hooklane.publish(db, tenant="acme", type="order.created", data={"order": 1})
    start_worker()
    await wait_for(lambda: receiver.at("orders"))
    got = receiver.at("orders")[0]
    payload = Webhook(SECRET).verify(got.body, got.headers)
    assert payload["id"] == event_id
    assert payload["type"] == "order.created"
    assert payload["data"] == {"order": 1}
    assert json.loads(got.body)["timestamp"].endswith("Z")
    # Settled once nothing is left to send; then the one delivery there is
    # must be this event's, to this endpoint, delivered at the first attempt.
    await wait_for(lambda: db.fetchval("SELECT bool_and(state IN ('delivered', 'dead')) FROM deliveries"))
    rows = await db.fetch("SELECT endpoint_id, event_tenant, event_id, state, attempts FROM deliveries")
    assert [tuple(r) for r in rows] == [(endpoint_id, "acme", event_id, "delivered", 1)]

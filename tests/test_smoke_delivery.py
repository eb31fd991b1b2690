"""End to end: publish, an in-process worker, a real receiver."""

from __future__ import annotations

import json

from standardwebhooks.webhooks import Webhook

import hooklane
from tests.conftest import SECRET, add_endpoint, wait_for
from tests.receivers import Answer


async def test_publish_is_delivered_signed(db, receiver, start_worker):
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)))
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
    state = await wait_for(lambda: db.fetchval("SELECT state FROM deliveries WHERE state = 'delivered'"))
    assert state == "delivered"

"""What tests/db/test_api_ingest.py and tests/processes/test_api_ingest.py
share."""

from __future__ import annotations

import json

from hooklane.store import Event

TOKEN = "ingest-token-0123456789"


AUTH = {"Authorization": f"Bearer {TOKEN}"}


EVENT = {"type": "order.created", "tenant": "acme", "data": {"order": 1}}


def event(event_id: str) -> Event:
    return Event(event_id, "acme", EVENT["type"], json.dumps(EVENT["data"]))

"""What tests/db/test_publish.py and tests/processes/test_publish.py share."""

from __future__ import annotations

import json

from hooklane.publish import MAX_DATA_BYTES, check_event
from testsupport.fixtures import wait_for

# 259 KB as the producer writes it, under the limit; as jsonb prints it,
# every float is 326 characters: a 12 MB delivery on 0.1.
TINY = {"readings": [5e-324] * 37_000}


# Each stored as a 309-digit integer, 11 MB in all.
HUGE = {"readings": [1e308] * 37_000}


# 5.5 KB as written, just under the limit as printed.
FITS = {"readings": [5e-324] * 790, "unit": "kelvin"}


READING = {"tenant": "acme", "type": "reading.taken"}


def compact(data: dict) -> str:
    return json.dumps(data, separators=(",", ":"))


def data_part(body: bytes) -> bytes:
    """The "data" of a delivery body, as sent (hooklane.signing.event_body)."""
    return body.split(b',"data":', 1)[1][:-1]


async def delivered_as_checked(receiver, start_worker, data: dict) -> None:
    start_worker()
    [arrived] = await wait_for(lambda: receiver.at("/hook"), timeout=30)
    sent = data_part(arrived.body)
    assert sent == check_event(**READING, data=data).encode()
    assert len(sent) <= MAX_DATA_BYTES and json.loads(sent) == data

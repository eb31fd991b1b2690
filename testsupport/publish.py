"""What the tests of publishing share (tests/db and tests/processes)."""

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


# Per endpoint, in sequence order: each delivery of a key with its number
# and whether it is due (its key's head) or waits behind it ('infinity').
_ORDERED = """
SELECT ep.name, d.event_id, d.ordering_seq, d.next_attempt_at < 'infinity' AS due
FROM deliveries d JOIN endpoints ep ON ep.id = d.endpoint_id
WHERE d.ordering_key = $1 AND d.state = 'pending'
ORDER BY ep.name, d.ordering_seq
"""


async def ordered_deliveries(db, key: str) -> dict[str, list[tuple[str, int, bool]]]:
    """The pending deliveries of ordering key ``key``, by endpoint name:
    (event id, sequence number, due), in sequence order."""
    found: dict[str, list[tuple[str, int, bool]]] = {}
    for row in await db.fetch(_ORDERED, key):
        found.setdefault(row["name"], []).append((row["event_id"], row["ordering_seq"], row["due"]))
    return found


def queued_in_order(event_ids: list[str]) -> list[tuple[str, int, bool]]:
    """What ordered_deliveries finds of an endpoint given ``event_ids`` of
    one key in commit order, none sent yet: numbered from 1, the first due."""
    return [(event_id, seq, seq == 1) for seq, event_id in enumerate(event_ids, 1)]

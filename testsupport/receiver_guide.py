"""What tests/db/test_receiver_guide.py and
tests/processes/test_receiver_guide.py share."""

from __future__ import annotations

import re
from pathlib import Path

import hooklane
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.receivers import Answer

GUIDE = Path(__file__).resolve().parents[1] / "docs" / "receivers.md"


def guide_block(language: str, holding: str) -> str:
    """The one ``language`` block of the guide that holds ``holding``."""
    blocks = re.findall(rf"^```{language}\n(.*?)^```", GUIDE.read_text(), flags=re.S | re.M)
    found = [b for b in blocks if holding in b]
    assert len(found) == 1, f"expected one {language} block with {holding!r} in {GUIDE.name}"
    return found[0]


async def delivery(db, start_worker, receiver):
    await add_endpoint(db, "guide", receiver.on("guide", Answer(204)))
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.updated", data={"id": 7, "note": "é ✓"})
    await wait_for(lambda: receiver.at("guide"))
    return receiver.at("guide")[0]

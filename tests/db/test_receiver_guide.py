"""docs/receivers.md's Python examples, run as written against a real
delivery: a worker signs, a receiver on loopback records the request, and
the verification example must accept it, and refuse it once tampered
with; the ordering example must apply it in order under the ordering
headers of a repeat and of a gap. The shell example:
tests/processes/test_receiver_guide.py."""

from __future__ import annotations

import pytest

from testsupport.fixtures import SECRET
from testsupport.receiver_guide import GUIDE, delivery, guide_block


async def test_the_python_example_verifies_a_real_delivery(db, start_worker, receiver):
    got = await delivery(db, start_worker, receiver)
    example: dict = {}
    exec(compile(guide_block("python", "def verify("), str(GUIDE), "exec"), example)
    verify = example["verify"]
    headers = {k.lower(): v for k, v in got.headers.items()}
    assert verify(got.body, headers, SECRET)["data"] == {"id": 7, "note": "é ✓"}
    with pytest.raises(PermissionError):
        verify(got.body.replace(b"7", b"8"), headers, SECRET)
    with pytest.raises(PermissionError):
        verify(got.body, headers, "whsec_" + "A" * 32)


async def test_the_ordering_example_applies_each_key_in_order(db, start_worker, receiver):
    got = await delivery(db, start_worker, receiver)
    example: dict = {}
    for holding in ("def verify(", "class OrderedEvents"):
        exec(compile(guide_block("python", holding), str(GUIDE), "exec"), example)
    headers = {k.lower(): v for k, v in got.headers.items()}
    event = example["verify"](got.body, headers, SECRET)
    applied: list[tuple[str | None, int]] = []
    gaps: list[tuple[str, int, int]] = []
    failing: set[int] = set()

    def apply(given: dict) -> None:
        step = given["data"]["step"]
        if step in failing:
            raise RuntimeError("the receiver's store is down")
        applied.append((given["data"]["key"], step))

    ordered = example["OrderedEvents"](apply, lambda *gap: gaps.append(gap))

    def send(key: str | None, number: str, step: int) -> int:
        ordering = {} if key is None else {"hooklane-ordering-key": key, "hooklane-ordering-sequence": number}
        given = {**event, "data": {**event["data"], "key": key, "step": step}}
        return ordered.receive({**headers, **ordering}, given)

    assert send(None, "", 0) == 204  # unordered: applied as it comes
    assert send("order-7", "1", 1) == 204
    assert send("order-7", "1", 2) == 204  # a repeat of the latest
    assert send("order-7", "2", 3) == 204
    assert send("order-8", "1", 4) == 204  # another key: numbered on its own
    assert send("order-7", "4", 5) == 204  # a gap: 3 was passed over
    assert send("order-7", "3", 6) == 204  # below the last applied: a repeat
    assert send("order-7", "4", 7) == 204
    failing.add(8)
    with pytest.raises(RuntimeError):
        send("order-7", "5", 8)
    assert send("order-7", "5", 9) == 204  # the retry after the failure
    for bad in ("", "x", "-1", "²", "1" * 20):
        assert send("order-7", bad, 10) == 400
    assert send("order-8", "1", 11) == 204  # the repeat of a key's latest, 1
    assert send("order-7", "1", 12) == 204  # a forgotten key numbered anew
    assert applied == [
        (None, 0),
        ("order-7", 1),
        ("order-7", 3),
        ("order-8", 4),
        ("order-7", 5),
        ("order-7", 9),
        ("order-7", 12),
    ]
    assert gaps == [("order-7", 2, 4)]
    assert ordered.last == {"order-7": 1, "order-8": 1}

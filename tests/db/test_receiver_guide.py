"""docs/receivers.md's Python verification example, run as written against
a real delivery: a worker signs, a receiver on loopback records the
request, and the example must accept it, and refuse it once tampered with.
The shell example: tests/processes/test_receiver_guide.py."""

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

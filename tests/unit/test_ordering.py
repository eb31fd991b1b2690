"""The order checks the ordering tests and the chaos suite apply to what a
receiver got (testsupport/receivers.py): they must catch what breaks it."""

from __future__ import annotations

import asyncio

from hooklane.worker.ordering import FIRST_RETRY_SECONDS, LAST_RETRY_SECONDS, first_of, next_retry
from testsupport.receivers import ORDERING_KEY, ORDERING_SEQUENCE, Received, numbers_by_key, order_broken


def _got(key: str | None, seq: int | None) -> Received:
    headers = {} if key is None else {ORDERING_KEY: key, ORDERING_SEQUENCE: str(seq)}
    return Received("/a", headers, b"{}", 0.0)


def test_numbers_are_read_per_key_in_arrival_order():
    got = [_got("k1", 1), _got(None, None), _got("k2", 1), _got("k1", 2), _got("k1", 2)]
    assert numbers_by_key(got) == {"k1": [1, 2, 2], "k2": [1]}


def test_a_repeat_of_the_latest_is_in_order_and_an_earlier_one_is_not():
    assert order_broken({"k": [1, 2, 2, 3, 5]}) == []
    assert order_broken({"k": [1, 2, 3, 2], "j": [1]}) == ["k: 2 after 3 in [1, 2, 3, 2]"]
    assert order_broken({"k": [2, 1]}) == ["k: 1 after 2 in [2, 1]"]


def test_a_busy_key_is_tried_again_soon_then_every_second_at_most():
    delays = [FIRST_RETRY_SECONDS]
    while delays[-1] < LAST_RETRY_SECONDS:
        delays.append(next_retry(delays[-1]))
    assert delays[:3] == [0.01, 0.02, 0.04]
    assert delays[-1] == LAST_RETRY_SECONDS == next_retry(LAST_RETRY_SECONDS)
    assert len(delays) == 8


async def test_an_idle_key_loop_waits_for_a_key_or_the_stop_and_nothing_else():
    added, stopping = asyncio.Event(), asyncio.Event()
    waiting = asyncio.ensure_future(first_of(added, stopping))
    await asyncio.sleep(0)
    assert not waiting.done()
    stopping.set()
    await asyncio.wait_for(waiting, timeout=5)
    added.set()
    stopping.clear()
    await asyncio.wait_for(first_of(added, stopping), timeout=5)
    # The waits it made are gone once it returns.
    assert all(t.done() for t in asyncio.all_tasks() if t is not asyncio.current_task())

"""When the worker runs a reservation round: only when one can find something.

The SQL side (what a round and `complete` report) is in
tests/db/test_reservation.py, the ready list's rules in tests/unit/test_ready_list.py;
here, the worker's decisions on top of them.
"""

from __future__ import annotations

import pytest

from hooklane.worker.trigger import _ROUND_INTERVAL, Trigger, Wake, round_pause, slot_freed_matters


def test_a_freed_slot_matters_only_to_a_worker_that_was_at_its_limit():
    assert slot_freed_matters(in_flight=255, concurrency=256)
    assert not slot_freed_matters(in_flight=254, concurrency=256)
    assert not slot_freed_matters(in_flight=0, concurrency=256)
    assert slot_freed_matters(in_flight=0, concurrency=1)


def test_rounds_share_a_window_only_while_slots_are_plentiful():
    assert round_pause(_ROUND_INTERVAL / 4, in_flight=3, concurrency=256) == pytest.approx(
        _ROUND_INTERVAL * 3 / 4
    )
    assert round_pause(1.0, in_flight=0, concurrency=256) == 0.0  # woken after a quiet spell: at once
    assert round_pause(0.0, in_flight=128, concurrency=256) == 0.0  # busy: freed slots are throughput


async def test_a_finished_delivery_wakes_the_reservation_only_at_the_worker_limit():
    trigger = Trigger(concurrency=2)
    trigger.slot_freed(in_flight=1)  # 2 of 2 were in flight: rounds had stopped
    assert await trigger.wait(0) is Wake.FIRED
    trigger.round_starts()
    trigger.slot_freed(in_flight=0)  # 1 of 2: a round was free to run anyway
    assert await trigger.wait(0) is Wake.POLL

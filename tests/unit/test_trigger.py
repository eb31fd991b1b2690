"""The worker's trigger: which events end the reservation's wait between
rounds, which of them skip the pause before a round, and when the recorder
writes at once (hooklane/worker/trigger.py; the rule is the paragraph on
rounds in docs/state-machine.md). The pure rules it applies, and a freed
slot, are in tests/unit/test_wake_rules.py."""

from __future__ import annotations

import asyncio

import pytest

from hooklane.worker.trigger import _ROUND_INTERVAL, Trigger, Wake

# Long enough never to end a wait in these tests: a wait that ends is one
# the trigger ended.
NEVER = 60.0


async def _ended(wait: asyncio.Task) -> object:
    """What a wait that the trigger should have ended returned."""
    return await asyncio.wait_for(wait, timeout=5)


async def test_a_wait_with_nothing_fired_is_the_poll():
    trigger = Trigger(concurrency=8)
    assert await trigger.wait(0) is Wake.POLL


@pytest.mark.parametrize("event", ["published", "partitions_taken", "work_found", "stopping"])
async def test_each_event_that_may_give_work_ends_the_wait(event):
    trigger = Trigger(concurrency=8)
    wait = asyncio.create_task(trigger.wait(NEVER))
    await asyncio.sleep(0)  # the wait has begun
    assert not wait.done()
    getattr(trigger, event)()
    assert await _ended(wait) is Wake.FIRED


@pytest.mark.parametrize("event", ["endpoint_ready", "probed"])
async def test_an_endpoint_ready_now_ends_the_wait_and_skips_the_pause(event):
    trigger = Trigger(concurrency=8)
    wait = asyncio.create_task(trigger.wait(NEVER))
    await asyncio.sleep(0)
    getattr(trigger, event)()
    assert await _ended(wait) is Wake.READY
    assert trigger.pause(Wake.READY, since_last=0.0, in_flight=0) == 0.0
    # whatever else fires with it
    trigger.published()
    assert await trigger.wait(0) is Wake.READY


@pytest.mark.parametrize("wake", [Wake.FIRED, Wake.POLL])
async def test_any_other_wake_pauses_to_share_a_round(wake):
    trigger = Trigger(concurrency=8)
    assert trigger.pause(wake, since_last=0.005, in_flight=1) == pytest.approx(_ROUND_INTERVAL - 0.005)
    assert trigger.pause(wake, since_last=1.0, in_flight=1) == 0.0  # after a quiet spell
    assert trigger.pause(wake, since_last=0.0, in_flight=4) == 0.0  # half the slots taken


async def test_what_fires_before_a_round_is_for_that_round_and_what_fires_during_it_for_the_next():
    trigger = Trigger(concurrency=8)
    trigger.published()  # during the pause: the round about to start sees it
    trigger.endpoint_ready()
    trigger.round_starts()
    assert await trigger.wait(0) is Wake.POLL
    trigger.round_starts()
    trigger.endpoint_ready()  # during the round: the wait after it ends at once
    assert await trigger.wait(NEVER) is Wake.READY
    trigger.round_starts()
    trigger.work_found()
    assert await trigger.wait(NEVER) is Wake.FIRED


async def test_an_awaited_result_ends_the_recorders_window_and_the_next_starts_afresh():
    trigger = Trigger(concurrency=8)
    assert await trigger.record_window(0) is False
    window = asyncio.create_task(trigger.record_window(NEVER))
    await asyncio.sleep(0)
    assert not window.done()
    trigger.result_awaited()
    assert await _ended(window) is True
    assert await trigger.record_window(0) is False
    trigger.result_awaited()  # while the previous batch was being written
    assert await asyncio.wait_for(trigger.record_window(NEVER), timeout=5) is True


async def test_the_rounds_and_the_recorder_wait_for_different_things():
    trigger = Trigger(concurrency=8)
    trigger.result_awaited()
    assert await trigger.wait(0) is Wake.POLL
    trigger.endpoint_ready()
    trigger.published()
    trigger.round_starts()
    assert await trigger.record_window(0) is True
    trigger.endpoint_ready()
    assert await trigger.record_window(0) is False

"""hooklane.operator.reflector.idle_turn: the status pass and the start's
comparisons wait while kopf's handlers have events queued, as at a
restart, where kopf wakes every resource's handlers at once."""

from __future__ import annotations

import asyncio
import time

from hooklane.operator import reflector

HANDLERS = 500
STEPS = 10


def _busy(seconds: float) -> None:
    until = time.perf_counter() + seconds
    while time.perf_counter() < until:
        pass


async def test_on_an_idle_loop_background_work_goes_at_once() -> None:
    loop = asyncio.get_running_loop()
    asked = loop.time()
    await reflector.idle_turn(most=30)
    assert loop.time() - asked < 1


async def test_background_work_waits_until_every_queued_handler_is_done() -> None:
    done = 0

    async def handler() -> None:
        nonlocal done
        # Every handler takes one step per turn of the loop, so that all of
        # them end in the same turn: a turn takes 0.1 ms per handler.
        for _ in range(STEPS):
            _busy(0.0001)
            await asyncio.sleep(0)
        done += 1

    handlers = [asyncio.create_task(handler()) for _ in range(HANDLERS)]
    await reflector.idle_turn(most=60)
    assert done == HANDLERS
    await asyncio.gather(*handlers)


async def test_on_a_loop_that_stays_busy_background_work_goes_after_its_longest_wait() -> None:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    async def hog() -> None:
        while not stop.is_set():
            _busy(0.02)
            await asyncio.sleep(0)

    hogging = asyncio.create_task(hog())
    asked = loop.time()
    await reflector.idle_turn(most=0.3)
    waited = loop.time() - asked
    stop.set()
    await hogging
    assert 0.3 <= waited < 2

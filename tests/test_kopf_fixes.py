"""hooklane.operator.kopf_fixes: kopf's start with thousands of resources,
as its queueing does it (a toggle per listed resource, each handler waiting
until none is left), without the N² wakeups."""

from __future__ import annotations

import asyncio

from kopf._cogs.aiokits import aiotoggles

from hooklane.operator import kopf_fixes

RESOURCES = 500


async def test_the_first_listing_wakes_each_waiting_handler_about_once():
    kopf_fixes.apply()
    indexed = aiotoggles.ToggleSet(all)
    checks = 0
    is_on = indexed.is_on

    def counted() -> bool:
        nonlocal checks
        checks += 1
        return is_on()

    indexed.is_on = counted  # type: ignore[method-assign]
    released: list[int] = []
    dropped = 0

    async def handler(number: int, toggle: aiotoggles.Toggle) -> None:
        nonlocal dropped
        await asyncio.sleep(0)
        await indexed.drop_toggle(toggle)
        dropped += 1
        await indexed.wait_for(True)
        released.append(dropped)

    tasks = []
    for number in range(RESOURCES):
        toggle = await indexed.make_toggle(name=str(number))
        tasks.append(asyncio.create_task(handler(number, toggle)))
        await asyncio.sleep(0)
    await asyncio.wait_for(asyncio.gather(*tasks), timeout=30)

    # Every handler ran only once every resource was indexed.
    assert released == [RESOURCES] * RESOURCES
    # kopf as released checks the state ~N²/2 times (125,000 here).
    assert checks < 10 * RESOURCES


async def test_a_single_toggle_still_wakes_its_waiters():
    kopf_fixes.apply()
    paused = aiotoggles.ToggleSet(any)
    toggle = await paused.make_toggle(name="peering")
    waiter = asyncio.create_task(toggle.wait_for(True))
    set_waiter = asyncio.create_task(paused.wait_for(True))
    await asyncio.sleep(0)
    await toggle.turn_to(True)
    await asyncio.wait_for(asyncio.gather(waiter, set_waiter), timeout=5)
    assert paused.is_on()
    await paused.drop_toggle(toggle)
    assert paused.is_off()

"""A worker's two classes of slots (hooklane/worker/slots.py), pure, and
the gauges that show them."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import REGISTRY

from hooklane import metrics
from hooklane.settings import Settings
from hooklane.worker.jobs import CallGauges
from hooklane.worker.ready import ReadyList
from hooklane.worker.slots import LONG_OVERDRAFT, Slots


def test_a_call_that_runs_long_gives_its_quick_slot_back():
    slots = Slots(quick=2, long=3)
    call = slots.start(1, "a", long=False)
    assert (slots.quick_free(), slots.long_free()) == (1, 3)
    assert slots.went_long(call)
    assert (slots.quick_free(), slots.long_free()) == (2, 2)
    assert not slots.went_long(call)  # once
    slots.done(call)
    assert (slots.quick_free(), slots.long_free()) == (2, 3)


def test_past_its_overdraft_the_long_class_takes_no_more_calls():
    """Calls past the threshold move even into a full long budget, up to
    twice it; beyond, a call keeps its quick slot, so that a worker never
    holds more sockets than its open-files limit was raised for."""
    slots = Slots(quick=8, long=2)
    calls = [slots.start(i, "a", long=False) for i in range(6)]
    held = 2 * LONG_OVERDRAFT
    assert [slots.went_long(c) for c in calls] == [True] * held + [False] * (6 - held)
    assert (slots.long_in_flight, slots.quick_in_flight) == (held, 6 - held)
    slots.done(calls[0])
    assert slots.went_long(calls[-1])


def test_a_slow_endpoints_call_starts_long():
    slots = Slots(quick=2, long=3)
    call = slots.start(1, "a", long=True)
    assert (slots.quick_free(), slots.long_free()) == (2, 2)
    assert not slots.went_long(call)
    slots.done(call)
    assert slots.long_free() == 3


def test_a_call_that_ended_does_not_move():
    """The timer that moves a call may fire after it ended."""
    slots = Slots(quick=1, long=1)
    call = slots.start(1, "a", long=False)
    slots.done(call)
    assert not slots.went_long(call)
    assert (slots.quick_in_flight, slots.long_in_flight) == (0, 0)


def test_the_busiest_tenants_only():
    slots = Slots(quick=100, long=100)
    calls = [slots.start(i, tenant, long=False) for i, tenant in enumerate("aaabbc")]
    assert slots.top_tenants(2) == [("a", 3), ("b", 2)]
    for call in calls[:3]:
        slots.done(call)
    assert slots.top_tenants(5) == [("b", 2), ("c", 1)]


@given(
    st.lists(
        st.tuples(st.sampled_from(["start quick", "start long", "goes long", "ends"]), st.integers(0, 9))
    )
)
def test_counts_match_the_calls_in_flight(steps):
    slots = Slots(quick=4, long=4)
    calls = []
    for step, n in steps:
        if step.startswith("start"):
            calls.append(slots.start(n, str(n % 3), long=step == "start long"))
        elif calls and step == "goes long":
            slots.went_long(calls[n % len(calls)])
        elif calls:
            slots.done(calls.pop(n % len(calls)))
    assert slots.quick_in_flight == sum(not c.long for c in calls)
    assert slots.long_in_flight == sum(c.long for c in calls)
    assert sum(n for _, n in slots.top_tenants(10)) == len(calls)


async def test_the_call_gauges_show_the_capacity_and_the_busiest_tenants_only():
    slots = Slots(quick=8, long=32)
    gauges = CallGauges(Settings(), slots, ReadyList())
    calls = [slots.start(i, f"tenant-{i % 12}", long=False) for i in range(12 + 10)]
    await gauges.run_once()

    def sample(name: str, **labels: str) -> float | None:
        return REGISTRY.get_sample_value(name, labels)

    assert sample("hooklane_worker_call_capacity", **{"class": "quick"}) == 8
    assert sample("hooklane_worker_call_capacity", **{"class": "long"}) == 32
    # tenants 0 to 9 have two calls each, 10 and 11 one: only the ten shown
    shown = {
        f"tenant-{i}": sample("hooklane_worker_tenant_calls_in_flight", tenant=f"tenant-{i}")
        for i in range(12)
    }
    assert {t for t, v in shown.items() if v is not None} == {
        f"tenant-{i}" for i in range(metrics.TOP_TENANTS)
    }
    assert shown["tenant-0"] == 2
    for call in calls:
        if call.tenant in ("tenant-0", "tenant-1"):
            slots.done(call)
    await gauges.run_once()
    # their series go; the next busiest take their places
    assert sample("hooklane_worker_tenant_calls_in_flight", tenant="tenant-0") is None
    assert sample("hooklane_worker_tenant_calls_in_flight", tenant="tenant-11") == 1

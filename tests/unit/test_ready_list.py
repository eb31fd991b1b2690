"""The worker's ready list (hooklane/worker/ready.py), pure: which endpoints a
round visits, when, and from which floor it reads each one's queue; and the
notifications and rows of migration 0009 it is fed with (hooklane_wake_v2's
payload, hooklane_reserve_v3's verdict rows, hooklane_complete_v3's rows).

The heart of it, checked by the model at the end: no pending delivery the
list was told of is ever below the floor the next round reads its endpoint's
queue from, and an endpoint with a due delivery is always scheduled."""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hooklane import store
from hooklane.worker.ready import (
    NOTHING,
    UNKNOWN,
    Candidate,
    ReadyList,
    Recorded,
    Verdict,
    Wakeup,
    lower,
    parse_wakeup,
)

NOW = datetime(2024, 12, 2, 14, 33, 20, tzinfo=UTC)
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def t(seconds: float) -> datetime:
    return NOW + timedelta(seconds=seconds)


def verdict(
    endpoint_id: int,
    *,
    exists: bool = True,
    deliverable: bool = True,
    paused_until: datetime | None = None,
    head: datetime | None = None,
    at_limit: bool = False,
    leases_end: datetime | None = None,
) -> Verdict:
    return Verdict(endpoint_id, exists, deliverable, paused_until, head, at_limit, leases_end)


def recorded_row(
    endpoint_id: int,
    *,
    partition: int = 0,
    deliverable: bool = True,
    paused_until: datetime | None = None,
    retried_head: datetime | None = None,
) -> Recorded:
    return Recorded(endpoint_id, partition, deliverable, paused_until, retried_head)


def listed(ready: ReadyList, heads: dict[int, datetime | None], *, partition: int = 0) -> None:
    """The endpoints as a first round leaves them: read from the start, each
    one's floor now its head (None: nothing pending), not in a round."""
    for endpoint_id in heads:
        ready.wake(endpoint_id, partition, None, NOW)
    candidates = ready.take(NOW, 1000)
    assert candidates == [Candidate(endpoint_id, UNKNOWN) for endpoint_id in heads]
    ready.settle([verdict(endpoint_id, head=head) for endpoint_id, head in heads.items()], [], NOW)


# lower
def test_lower_unknown_absorbs_everything():
    assert lower(UNKNOWN, t(0)) is UNKNOWN
    assert lower(UNKNOWN, None) is UNKNOWN
    assert lower(t(0), None) is UNKNOWN
    assert lower(NOTHING, None) is UNKNOWN


def test_lower_takes_the_earlier_time():
    assert lower(t(5), t(3)) == t(3)
    assert lower(t(3), t(5)) == t(3)
    assert lower(t(3), t(3)) == t(3)


def test_lower_nothing_gives_way_to_any_time():
    assert datetime.max.replace(tzinfo=UTC) == NOTHING
    assert lower(NOTHING, t(3)) == t(3)
    assert lower(NOTHING, NOTHING) == NOTHING
    assert lower(t(3), NOTHING) == t(3)


# parse_wakeup
def test_a_wakeup_gives_its_due_to_the_microsecond():
    wakeup = parse_wakeup("17 1733150000123456 5,42,1000000000001")
    assert wakeup == Wakeup(17, datetime(2024, 12, 2, 14, 33, 20, 123456, tzinfo=UTC), (5, 42, 1000000000001))
    assert wakeup is not None and wakeup.due is not None
    # floors are compared with >= in SQL: one microsecond off could skip a delivery
    assert (wakeup.due - EPOCH) // timedelta(microseconds=1) == 1733150000123456
    assert wakeup.due.tzinfo is not None and wakeup.due.utcoffset() == timedelta(0)


def test_a_wakeup_of_an_endpoint_changed_has_no_due():
    assert parse_wakeup("0 - 7") == Wakeup(0, None, (7,))
    assert parse_wakeup("4095 - 1,2,3") == Wakeup(4095, None, (1, 2, 3))


def test_a_wakeup_before_the_epoch_counts_back_from_it():
    assert parse_wakeup("3 -1 9") == Wakeup(3, EPOCH - timedelta(microseconds=1), (9,))
    assert parse_wakeup("3 0 9") == Wakeup(3, EPOCH, (9,))


def test_a_partition_alone_is_not_ours():
    assert parse_wakeup("12") is None
    assert parse_wakeup("0") is None


@pytest.mark.parametrize(
    "payload",
    [
        "",
        " ",
        "\u0661",  # an Arabic-Indic one: str.isdigit says yes
        "\uff13",  # a fullwidth three
        "3 \u0661 1",
        "3 1 \u0661",
        "3 - 1,\u0662",
        "\u00b2",  # superscript two
        "-3",
        "-3 - 1",
        "+3",
        "3 +1 1",
        "3 - +1",
        "3 - -1",
        "a",
        "3a",
        "3 x 1",
        "3 1 a",
        "3 1.5 1",
        "3 1e6 1",
        "3 1_000 1",
        "3 - 1_000",
        "3 -",
        "3 1",
        "3 1 ",
        " 3",
        "3 ",
        "3  1 1",
        "3 1  1",
        "3 1 1 1",
        "3 - 1 2",
        "3 1 1,",
        "3 1 ,1",
        "3 1 1,,2",
        "3\t1 1",
        "3 1 1\n",
        "3\n",
    ],
)
def test_a_payload_that_is_not_ours_gives_none(payload):
    assert parse_wakeup(payload) is None


@pytest.mark.parametrize(
    "payload",
    [
        "3 --5 1",  # "5" once its dashes are stripped; int() refuses it
        "3 -5- 1",
        "3 253402300800000000 1",  # year 10000: past datetime.max
        "3 -62135596800000001 1",  # before year 1
        "3 99999999999999999999999 1",  # past timedelta
        pytest.param("3 - " + "9" * 5000, id="an id past int()'s digit limit"),
        pytest.param("9" * 5000, id="a partition past int()'s digit limit"),
    ],
)
def test_a_payload_that_is_not_ours_never_raises(payload):
    """None for anything else, never an exception in the listener."""
    assert parse_wakeup(payload) is None


def wake_v2_payload(partition: int, due: datetime | None, endpoint_ids: list[int]) -> str:
    """As hooklane_wake_v2 formats it: (extract(epoch FROM due) * 1000000)::bigint,
    or '-'; the endpoint ids distinct and in order."""
    micros = "-" if due is None else str((due - EPOCH) // timedelta(microseconds=1))
    return f"{partition} {micros} {','.join(str(i) for i in sorted(set(endpoint_ids)))}"


sane_dues = st.datetimes(
    min_value=datetime(1900, 1, 1), max_value=datetime(2300, 1, 1), timezones=st.just(UTC)
)


@given(
    st.integers(0, 4095),
    st.none() | sane_dues,
    st.lists(st.integers(1, 2**63 - 1), min_size=1, max_size=300),
)
def test_a_wakeup_comes_back_as_hooklane_wake_v2_wrote_it(partition, due, endpoint_ids):
    wakeup = parse_wakeup(wake_v2_payload(partition, due, endpoint_ids))
    assert wakeup == Wakeup(partition, due, tuple(sorted(set(endpoint_ids))))
    assert wakeup is not None and (due is None or wakeup.due.utcoffset() == timedelta(0))


# Verdict.of, from rows as the reservation returns them, and what the
# ready list takes of a row of complete


def reserve_v3_verdict_row(**columns: object) -> dict[str, object]:
    row: dict[str, object] = dict.fromkeys(
        [
            "id",
            "attempts",
            "created_at",
            "namespace",
            "name",
            "url",
            "secret",
            "timeout_seconds",
            "event_id",
            "type",
            "data",
            "event_created_at",
            "previous_secret",
            "tenant",  # hooklane_reserve_v7's: set while the tenant's ceiling holds it
        ]
    )
    row.update(columns)
    return row


def test_a_verdict_row_of_an_endpoint():
    row = reserve_v3_verdict_row(
        endpoint_id=7,
        max_concurrency=4,
        deliverable=True,
        paused_until=t(30),
        head=t(-5),
        at_limit=True,
        leases_end=t(12),
    )
    assert Verdict.of(row) == Verdict(7, True, True, t(30), t(-5), True, t(12))


def test_a_verdict_row_of_an_endpoint_with_nothing_pending():
    row = reserve_v3_verdict_row(
        endpoint_id=7,
        max_concurrency=1,
        deliverable=False,
        paused_until=None,
        head=None,
        at_limit=False,
        leases_end=None,
    )
    assert Verdict.of(row) == Verdict(7, True, False, None, None, False, None)


def test_a_verdict_row_of_a_deleted_endpoint():
    # LEFT JOIN endpoints: every column of it NULL; k.ok and at_limit coalesce to false
    row = reserve_v3_verdict_row(
        endpoint_id=7,
        max_concurrency=None,
        deliverable=False,
        paused_until=None,
        head=None,
        at_limit=False,
        leases_end=None,
    )
    v = Verdict.of(row)
    assert v == Verdict(7, False, False, None, None, False, None)
    assert not v.exists


def test_a_complete_row():
    row = store.Touched(
        7, 3, "acme", "orders", "active", t(60), 5, True, t(10), True, False, None, 4, False, None
    )
    assert row.recorded() == Recorded(7, 3, True, t(60), t(10))
    row = row._replace(state="deactivated", paused_until=None, deliverable=False, retried_head=None)
    assert row.recorded() == Recorded(7, 3, False, None, None)
    # A Retry-After's hold on an adaptive endpoint waits as a pause does.
    row = row._replace(state="active", deliverable=True, throttled_until=t(30))
    assert row.recorded() == Recorded(7, 3, True, t(30), None)
    row = row._replace(paused_until=t(90))
    assert row.recorded() == Recorded(7, 3, True, t(90), None)


# wake
def test_a_new_endpoint_is_read_from_the_start():
    ready = ReadyList()
    ready.wake(1, 0, t(-5), NOW)
    assert len(ready) == 1
    assert ready.floor(1) is UNKNOWN
    assert ready.due(1) == NOW  # max(due, now)
    assert ready.scheduled(1)
    assert ready.busy(1) == 0


def test_a_new_endpoint_with_a_retry_ahead_is_due_then():
    ready = ReadyList()
    ready.wake(1, 0, t(40), NOW)
    assert ready.floor(1) is UNKNOWN
    assert ready.due(1) == t(40)
    assert ready.take(t(39), 10) == []
    assert ready.take(t(40), 10) == [Candidate(1, UNKNOWN)]


def test_a_new_endpoint_changed_is_due_now():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    assert ready.floor(1) is UNKNOWN
    assert ready.due(1) == NOW


def test_an_unknown_endpoint():
    ready = ReadyList()
    assert ready.floor(1) is UNKNOWN
    assert ready.due(1) is None
    assert not ready.scheduled(1)
    assert ready.busy(1) == 0
    assert ready.next_due() is None
    assert ready.take(NOW, 10) == []


def test_a_wake_lowers_the_floor():
    ready = ReadyList()
    listed(ready, {1: t(100)})
    assert ready.floor(1) == t(100)
    assert ready.due(1) == t(100)
    # a publish held open in a long transaction: due before the floor
    ready.wake(1, 0, t(-50), t(1))
    assert ready.floor(1) == t(-50)
    assert ready.due(1) == t(1)  # max(due, now)
    # a later due lowers nothing
    ready.wake(1, 0, t(20), t(2))
    assert ready.floor(1) == t(-50)
    assert ready.due(1) == t(1)


def test_a_wake_keeps_an_earlier_due():
    ready = ReadyList()
    listed(ready, {1: t(10)})
    assert ready.due(1) == t(10)
    ready.wake(1, 0, t(30), NOW)
    assert ready.floor(1) == t(10)
    assert ready.due(1) == t(10)
    ready.wake(1, 0, t(5), NOW)
    assert ready.floor(1) == t(5)
    assert ready.due(1) == t(5)


def test_a_wake_of_an_endpoint_with_nothing_pending_sets_its_floor():
    ready = ReadyList()
    listed(ready, {1: None})
    assert ready.floor(1) == NOTHING
    assert ready.due(1) is None
    assert not ready.scheduled(1)
    ready.wake(1, 0, t(3), t(5))
    assert ready.floor(1) == t(3)
    assert ready.due(1) == t(5)
    assert ready.take(t(5), 10) == [Candidate(1, t(3))]


def test_a_wake_without_due_keeps_the_floor_and_is_due_now():
    ready = ReadyList()
    listed(ready, {1: t(100)})
    ready.wake(1, 0, None, t(1))
    assert ready.floor(1) == t(100)
    assert ready.due(1) == t(1)


def test_a_head_the_sweep_read_from_its_last_run_sets_no_floor_for_an_endpoint_it_did_not_know():
    ready = ReadyList()
    # read from a time on, not from the start: earlier deliveries may be
    # pending, so the first round reads from the start
    ready.listed(1, 0, t(-5), NOW, from_start=False)
    assert ready.floor(1) is UNKNOWN
    assert ready.take(NOW, 10) == [Candidate(1, UNKNOWN)]
    # read from the start, the head is the floor
    ready.listed(2, 0, t(-5), NOW)
    assert ready.floor(2) == t(-5)


def test_a_head_the_sweep_read_from_its_last_run_lowers_a_known_floor_only():
    ready = ReadyList()
    listed(ready, {1: t(-20), 2: t(100)})
    ready.listed(1, 0, t(-5), NOW, from_start=False)
    assert ready.floor(1) == t(-20)
    ready.listed(2, 0, t(-5), NOW, from_start=False)  # written by hand, below the floor
    assert ready.floor(2) == t(-5)
    assert ready.due(2) == NOW


# take
def test_take_hands_the_earliest_due_first_and_ties_in_the_order_scheduled():
    ready = ReadyList()
    ready.wake(5, 0, t(3), NOW)
    ready.wake(4, 0, t(1), NOW)
    ready.wake(9, 0, t(2), NOW)
    ready.wake(2, 0, t(2), NOW)
    ready.wake(1, 0, t(2), NOW)
    assert ready.next_due() == t(1)
    assert [c.endpoint_id for c in ready.take(t(10), 10)] == [4, 9, 2, 1, 5]


def test_take_hands_only_what_is_due_and_up_to_the_limit():
    ready = ReadyList()
    for endpoint_id in range(1, 6):
        ready.wake(endpoint_id, 0, t(endpoint_id), NOW)
    assert ready.take(t(0.5), 10) == []
    assert [c.endpoint_id for c in ready.take(t(3), 2)] == [1, 2]
    assert [c.endpoint_id for c in ready.take(t(3), 2)] == [3]
    assert ready.next_due() == t(4)
    assert ready.take(t(10), 0) == []
    assert [c.endpoint_id for c in ready.take(t(10), 10)] == [4, 5]
    assert ready.next_due() is None


def test_take_hands_each_endpoint_with_its_floor():
    ready = ReadyList()
    listed(ready, {1: t(-10)})
    ready.wake(2, 0, None, NOW)
    assert ready.take(NOW, 10) == [Candidate(1, t(-10)), Candidate(2, UNKNOWN)]


def test_an_endpoint_is_not_handed_twice_before_its_verdict():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    assert ready.take(NOW, 10) == [Candidate(1, UNKNOWN)]
    assert ready.scheduled(1)
    ready.wake(1, 0, t(-1), NOW)
    ready.wake(1, 0, None, NOW)
    assert ready.take(t(60), 10) == []
    assert ready.next_due() is None
    ready.settle([verdict(1, head=t(-3))], [], t(1))
    assert ready.take(t(1), 10) == [Candidate(1, t(-3))]


def test_many_wakes_of_an_endpoint_hand_it_once():
    ready = ReadyList()
    listed(ready, {1: t(0)})
    for i in range(3000):
        ready.wake(1, 0, t(-i), NOW)
        ready.wake(2, 0, None, NOW)
    assert ready.floor(1) == t(-2999)
    assert ready.take(NOW, 10) == [Candidate(1, t(-2999)), Candidate(2, UNKNOWN)]
    assert ready.take(NOW, 10) == []


def test_retain_forgets_the_endpoints_of_other_partitions():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.wake(2, 1, None, NOW)
    ready.wake(3, 2, t(5), NOW)
    ready.retain({0, 2})
    assert len(ready) == 2
    assert not ready.scheduled(2)
    assert ready.due(2) is None
    assert [c.endpoint_id for c in ready.take(t(10), 10)] == [1, 3]
    ready.retain(set())
    assert len(ready) == 0
    assert ready.next_due() is None


# settle
def test_a_verdict_moves_the_floor_to_the_head():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-3))], [(100, 1)], t(1))
    assert ready.floor(1) == t(-3)
    # a due head: back of the line, now
    assert ready.due(1) == t(1)
    assert ready.busy(1) == 1


def test_a_head_ahead_is_due_then():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(90))], [], t(1))
    assert ready.floor(1) == t(90)
    assert ready.due(1) == t(90)
    assert ready.next_due() == t(90)


def test_nothing_pending_takes_the_endpoint_off_until_a_wake():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None)], [(100, 1), (101, 1)], t(1))
    assert ready.floor(1) == NOTHING
    assert ready.due(1) is None
    assert not ready.scheduled(1)
    assert ready.busy(1) == 2
    assert ready.next_due() is None
    assert len(ready) == 1


def test_an_endpoint_settled_while_a_sweep_read_is_not_lost():
    """The sweep lists pending endpoints from a snapshot while rounds go on:
    one whose last delivery a round reserved meanwhile is unscheduled, and
    rightly so."""
    ready = ReadyList()
    ready.wake(1, 0, t(0), NOW)  # a publish: pending from t(0)
    ready.wake(2, 0, t(0), NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(2, head=None)], [(200, 2)], NOW)  # 2 settled before the read
    mark = ready.mark()
    ready.settle([verdict(1, head=None)], [(100, 1)], t(0.1))  # 1 during it
    assert not ready.scheduled(1) and not ready.scheduled(2)
    assert not ready.lost(1, mark)
    # What nothing handled since before the read, and what the list never
    # knew, the listing's snapshot finds lost.
    assert ready.lost(2, mark)
    assert ready.lost(3, mark)
    ready.wake(2, 0, t(1), t(1))
    assert not ready.lost(2, mark)


def test_a_deleted_endpoint_is_forgotten():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, exists=False, deliverable=False)], [], t(1))
    assert len(ready) == 0
    assert not ready.scheduled(1)


def test_floors_are_read_for_the_partitions_asked():
    ready = ReadyList()
    ready.wake(1, 0, t(1), NOW)
    ready.wake(2, 1, t(2), NOW)
    ready.listed(3, 1, t(3), NOW)
    # An unknown floor is read from the start of time.
    start = datetime.min.replace(tzinfo=UTC)
    assert ready.floors([1]) == {2: start, 3: t(3)}
    ready.take(t(3), 10)
    ready.settle([verdict(2, exists=False, deliverable=False)], [], t(3))
    assert ready.floors([1]) == {3: t(3)}
    ready.retain({0})
    assert ready.floors([0, 1]) == {1: start}


def test_a_deleted_endpoint_woken_during_the_round_is_judged_again():
    """The wake may tell of what the round did not see; the next verdict
    forgets it."""
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.wake(1, 0, t(0.5), t(0.5))
    ready.settle([verdict(1, exists=False, deliverable=False)], [], t(1))
    assert len(ready) == 1
    assert ready.due(1) == t(1)
    assert ready.take(t(1), 10) == [Candidate(1, UNKNOWN)]
    ready.settle([verdict(1, exists=False, deliverable=False)], [], t(2))
    assert len(ready) == 0


def test_a_verdict_not_deliverable_keeps_the_floor_until_a_wake():
    ready = ReadyList()
    listed(ready, {1: t(-5)})
    ready.take(NOW, 10)
    ready.settle([verdict(1, deliverable=False, head=None)], [], t(1))
    assert ready.floor(1) == t(-5)  # head is not read for an endpoint not deliverable
    assert ready.due(1) is None
    assert not ready.scheduled(1)
    ready.wake(1, 0, None, t(2))  # reactivated
    assert ready.take(t(2), 10) == [Candidate(1, t(-5))]


def test_a_publish_committed_during_the_round_is_not_skipped():
    """The verdict's head was read before a publish held open since earlier
    committed: its wake, during the round, lowers the floor again."""
    ready = ReadyList()
    listed(ready, {1: t(-10)})
    assert ready.take(NOW, 10) == [Candidate(1, t(-10))]
    ready.wake(1, 0, t(-30), t(0.5))
    ready.settle([verdict(1, head=t(20))], [(100, 1)], t(1))
    assert ready.floor(1) == t(-30)
    assert ready.due(1) == t(1)
    assert ready.take(t(1), 10) == [Candidate(1, t(-30))]


def test_a_later_wake_during_the_round_lowers_the_head_it_is_under():
    ready = ReadyList()
    listed(ready, {1: t(-10)})
    ready.take(NOW, 10)
    ready.wake(1, 0, t(5), t(0.5))
    ready.settle([verdict(1, head=t(60))], [], t(1))
    assert ready.floor(1) == t(5)
    assert ready.due(1) == t(1)  # woken during the round: now


def test_an_endpoint_changed_during_the_round_is_due_now():
    ready = ReadyList()
    listed(ready, {1: t(-10)})
    ready.take(NOW, 10)
    ready.wake(1, 0, None, t(0.5))
    ready.settle([verdict(1, head=t(60))], [], t(1))
    assert ready.floor(1) == t(60)
    assert ready.due(1) == t(1)


def test_a_paused_circuit_is_due_when_it_closes():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.wake(2, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle(
        [verdict(1, paused_until=t(30), head=t(-5)), verdict(2, paused_until=t(30), head=t(50))], [], t(1)
    )
    assert ready.due(1) == t(30)
    assert ready.due(2) == t(50)  # max(paused_until, floor)
    assert ready.floor(1) == t(-5)


def test_a_pause_already_over_is_no_pause():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, paused_until=t(-30), head=t(-5))], [], t(1))
    assert ready.due(1) == t(1)


def test_slots_held_by_this_worker_wait_for_a_result():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-5), at_limit=True, leases_end=t(30))], [(100, 1), (101, 1)], t(1))
    assert ready.busy(1) == 2
    assert ready.due(1) is None
    assert ready.scheduled(1)
    assert ready.next_due() is None
    assert ready.take(t(1000), 10) == []
    assert ready.recorded([100], [recorded_row(1)], t(2)) is True
    assert ready.busy(1) == 1
    assert ready.due(1) == t(2)
    assert ready.take(t(2), 10) == [Candidate(1, t(-5))]


def test_slots_held_by_others_only_are_looked_at_when_a_lease_ends():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.wake(2, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle(
        [verdict(1, head=t(-5), at_limit=True, leases_end=t(30)), verdict(2, head=t(-5), at_limit=True)],
        [],
        t(1),
    )
    assert ready.due(1) == t(30)
    assert ready.due(2) == t(2)  # not said: a second from now
    assert ready.busy(1) == ready.busy(2) == 0


def test_busy_counts_the_deliveries_reserved_until_recorded():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.wake(2, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None), verdict(2, head=None)], [(100, 1), (101, 2), (102, 1)], t(1))
    assert (ready.busy(1), ready.busy(2)) == (2, 1)
    ready.recorded([100, 101], [recorded_row(1), recorded_row(2)], t(2))
    assert (ready.busy(1), ready.busy(2)) == (1, 0)
    ready.recorded([100, 999], [], t(3))  # recorded already, or never reserved here
    assert (ready.busy(1), ready.busy(2)) == (1, 0)
    ready.recorded([102], [recorded_row(1)], t(3))
    assert (ready.busy(1), ready.busy(2)) == (0, 0)


def test_a_verdict_for_an_endpoint_not_in_a_round_changes_nothing():
    ready = ReadyList()
    listed(ready, {1: t(40)})
    ready.settle([verdict(1, head=None), verdict(2, head=t(0))], [], t(1))
    assert ready.floor(1) == t(40)
    assert ready.due(1) == t(40)
    assert len(ready) == 1


# recorded
def test_a_retry_recorded_lowers_the_floor_and_is_due_then():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None)], [(100, 1)], t(1))
    assert ready.recorded([100], [recorded_row(1, retried_head=t(60))], t(2)) is False
    assert ready.floor(1) == t(60)
    assert ready.due(1) == t(60)
    assert ready.busy(1) == 0


def test_a_result_that_frees_a_slot_of_a_due_endpoint_asks_for_a_round():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-5), at_limit=True)], [(100, 1)], t(1))
    assert ready.recorded([100], [recorded_row(1, retried_head=t(60))], t(2)) is True
    assert ready.floor(1) == t(-5)
    assert ready.due(1) == t(2)


def test_a_result_keeps_an_earlier_due():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(30))], [(100, 1)], t(1))
    assert ready.due(1) == t(30)
    assert ready.recorded([100], [recorded_row(1, retried_head=t(60))], t(2)) is False
    assert ready.due(1) == t(30)
    assert ready.floor(1) == t(30)


def test_a_result_leaves_an_endpoint_with_nothing_pending_alone():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None)], [(100, 1)], t(1))
    assert ready.recorded([100], [recorded_row(1)], t(2)) is False
    assert ready.floor(1) == NOTHING
    assert not ready.scheduled(1)


def test_a_result_of_an_endpoint_not_deliverable_schedules_nothing():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None)], [(100, 1)], t(1))
    assert ready.recorded([100], [recorded_row(1, deliverable=False, retried_head=t(0))], t(2)) is False
    assert ready.floor(1) == t(0)  # lowered still: what is pending is known
    assert not ready.scheduled(1)
    assert ready.busy(1) == 0


def test_a_result_that_opens_the_circuit_is_due_when_it_closes():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-5))], [(100, 1)], t(1))
    assert ready.due(1) == t(1)
    assert ready.recorded([100], [recorded_row(1, paused_until=t(45), retried_head=t(10))], t(2)) is False
    assert ready.due(1) == t(45)
    assert ready.floor(1) == t(-5)
    assert ready.take(t(44), 10) == []
    assert ready.take(t(45), 10) == [Candidate(1, t(-5))]


def test_a_result_for_an_endpoint_not_listed_is_ignored():
    ready = ReadyList()
    ready.retain({0})
    assert ready.recorded([100], [recorded_row(1)], NOW) is False
    assert len(ready) == 0


def test_a_retry_for_an_endpoint_of_a_partition_not_owned_is_ignored():
    """hooklane_complete_v3 notified its owner."""
    ready = ReadyList()
    ready.retain({0})
    assert ready.recorded([100], [recorded_row(1, partition=1, retried_head=t(-1))], NOW) is False
    assert len(ready) == 0
    assert not ready.scheduled(1)


def test_a_retry_recorded_during_a_round_counts_as_a_wake():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(50))], [(100, 1)], t(1))
    assert ready.take(t(50), 10) == [Candidate(1, t(50))]
    # the retry of 100 committed after the verdict's snapshot, below its floor
    assert ready.recorded([100], [recorded_row(1, retried_head=t(20))], t(50.5)) is False
    assert ready.busy(1) == 0
    ready.settle([verdict(1, head=t(80))], [(101, 1)], t(51))
    assert ready.floor(1) == t(20)
    assert ready.due(1) == t(51)
    assert ready.busy(1) == 1


def test_a_slot_freed_during_a_round_gets_the_endpoint_looked_at_again():
    # The verdict's snapshot may predate the result: its at_limit could
    # count the slot the result freed.
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-5))], [(100, 1)], t(1))
    ready.take(t(1), 10)
    assert ready.recorded([100], [recorded_row(1)], t(1.5)) is False
    assert ready.scheduled(1)
    assert ready.take(t(2), 10) == []
    ready.settle([verdict(1, head=t(-5), at_limit=True, leases_end=t(30))], [(101, 1)], t(2))
    assert ready.due(1) == t(2) and ready.busy(1) == 1
    assert ready.take(t(2), 10) == [Candidate(1, t(-5))]
    ready.settle([verdict(1, head=None)], [], t(3))
    assert not ready.scheduled(1)


# returned
def test_a_failed_round_hands_its_candidates_back_with_their_floors():
    ready = ReadyList()
    listed(ready, {1: t(-10)})
    ready.wake(2, 0, None, NOW)
    candidates = ready.take(NOW, 10)
    assert candidates == [Candidate(1, t(-10)), Candidate(2, UNKNOWN)]
    ready.returned(candidates, t(1))
    assert ready.due(1) == ready.due(2) == t(1)
    assert ready.take(t(1), 10) == candidates


def test_a_wake_during_a_failed_round_lowers_the_floor():
    ready = ReadyList()
    listed(ready, {1: t(-10), 2: t(-10)})
    candidates = ready.take(NOW, 10)
    ready.wake(1, 0, t(-20), t(0.5))
    ready.wake(2, 0, t(-1), t(0.5))
    ready.returned(candidates, t(1))
    assert ready.take(t(1), 10) == [Candidate(1, t(-20)), Candidate(2, t(-10))]


def test_a_candidate_returned_after_its_partition_was_released_is_forgotten():
    ready = ReadyList()
    ready.wake(1, 3, None, NOW)
    candidates = ready.take(NOW, 10)
    ready.retain(set())
    ready.returned(candidates, t(1))
    assert len(ready) == 0
    assert ready.take(t(1), 10) == []


# An endpoint waiting for this worker's own slots (at_limit, busy > 0): only
# a recorded result frees one, but a change of the endpoint (a higher limit,
# an unpause: a wake with nothing written) or the sweep has it judged again.


def waiting(ready: ReadyList, endpoint_id: int = 1) -> None:
    ready.wake(endpoint_id, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle(
        [verdict(endpoint_id, head=t(-5), at_limit=True, leases_end=t(30))], [(100, endpoint_id)], t(1)
    )
    assert ready.scheduled(endpoint_id) and ready.due(endpoint_id) is None
    assert ready.next_due() is None


def test_a_change_of_an_endpoint_waiting_for_a_slot_gets_it_visited():
    ready = ReadyList()
    waiting(ready)
    ready.wake(1, 0, None, t(2))
    assert ready.due(1) == t(2)
    assert ready.take(t(2), 10) == [Candidate(1, t(-5))]


def test_the_sweep_gets_an_endpoint_waiting_for_a_slot_visited():
    ready = ReadyList()
    waiting(ready)
    ready.listed(1, 0, t(-5), t(2), from_start=False)
    assert ready.take(t(2), 10) == [Candidate(1, t(-5))]


def test_a_publish_to_an_endpoint_waiting_for_a_slot_waits_for_a_result():
    ready = ReadyList()
    waiting(ready)
    ready.wake(1, 0, t(-20), t(2))
    assert ready.floor(1) == t(-20)
    assert ready.scheduled(1)
    assert ready.take(t(60), 10) == []
    assert ready.recorded([100], [recorded_row(1)], t(3)) is True
    assert ready.take(t(3), 10) == [Candidate(1, t(-20))]


def test_a_publish_during_a_round_that_finds_the_slots_held_here_waits_for_a_result():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.wake(1, 0, t(-20), t(0.5))
    ready.settle([verdict(1, head=t(-5), at_limit=True, leases_end=t(30))], [(100, 1)], t(1))
    assert ready.floor(1) == t(-20)  # lowered all the same
    assert ready.scheduled(1)
    assert ready.take(t(60), 10) == []
    assert ready.recorded([100], [recorded_row(1)], t(3)) is True
    assert ready.take(t(3), 10) == [Candidate(1, t(-20))]


def test_a_change_during_a_round_that_finds_the_slots_held_here_is_judged_again():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.wake(1, 0, None, t(0.5))  # its limit raised
    ready.settle([verdict(1, head=t(-5), at_limit=True, leases_end=t(30))], [(100, 1)], t(1))
    assert ready.due(1) == t(1)
    assert ready.take(t(1), 10) == [Candidate(1, t(-5))]


def test_a_publish_during_a_round_that_finds_the_slots_held_elsewhere_is_due_now():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.wake(1, 0, t(-20), t(0.5))
    ready.settle([verdict(1, head=t(-5), at_limit=True, leases_end=t(30))], [], t(1))
    assert ready.due(1) == t(1)


# A partition released and taken again while this worker's deliveries to
# its endpoints are in flight: store.pending_endpoints lists only the
# endpoints with pending deliveries, so one whose only delivery is in flight
# is not listed again.
def test_a_retry_of_an_endpoint_listed_again_without_it_is_not_left_to_the_sweep():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=None)], [(100, 1)], t(1))
    ready.retain(set())  # partition 0 released ...
    ready.retain({0})  # ... and taken again: nothing of endpoint 1 pending, 100 in flight
    ready.recorded([100], [recorded_row(1, retried_head=t(30))], t(2))
    # hooklane_complete_v3 notifies only the owners of partitions the
    # recording worker does not own: nothing else tells the list of it
    assert ready.scheduled(1)
    due, floor = ready.due(1), ready.floor(1)
    assert due is not None and due <= t(30)
    assert floor is UNKNOWN or floor <= t(30)
    assert [c.endpoint_id for c in ready.take(t(30), 10)] == [1]


def test_a_result_reserved_before_the_partition_moved_frees_no_later_slot():
    ready = ReadyList()
    ready.wake(1, 0, None, NOW)
    ready.take(NOW, 10)
    ready.settle([verdict(1, head=t(-1))], [(100, 1)], t(1))
    ready.retain(set())
    ready.wake(1, 0, None, t(2))  # taken again: endpoint 1 has a pending delivery
    ready.take(t(2), 10)
    ready.settle([verdict(1, head=None, at_limit=True)], [(101, 1)], t(2))
    assert ready.busy(1) >= 1
    ready.recorded([100], [recorded_row(1)], t(3))
    assert ready.busy(1) == 1  # 101 is still in flight


# The model: a queue per endpoint in a simulated store, the rounds
# reserving from it as hooklane_reserve_v3 does, publishes (some held open
# in long transactions), results and notifications interleaving with them.

ENDPOINTS = {1: 0, 2: 0, 3: 1}  # endpoint: partition
LIMITS = {1: 1, 2: 2, 3: 3}  # max_concurrency at first
TENANTS = {1: "a", 2: "a", 3: "b"}
LEASE = 60  # seconds a reservation of this worker holds its slot
SWEEP = 60  # seconds between sweeps


@dataclass
class Pending:
    endpoint: int
    key: int  # next_attempt_at, seconds from NOW
    token: int  # this pending spell of the delivery
    announced: bool = False  # the list was told of it (a notification, a result, a rescan)


# The slow class and its tenants' turns (hooklane/worker/slots.py)


def slow_endpoints(ready: ReadyList, tenants: dict[int, str]) -> None:
    """Endpoints with work due, each with a call that ran long."""
    listed(ready, dict.fromkeys(tenants, t(-1)))
    for endpoint_id, tenant in tenants.items():
        ready.started(endpoint_id, tenant, False)
        ready.went_long(endpoint_id)


def test_a_call_that_runs_long_makes_its_endpoint_slow_until_one_answers_quickly():
    ready = ReadyList()
    slow_endpoints(ready, {1: "a"})
    assert ready.slow(1)
    ready.ended(1, long=True, took_long=True)
    assert ready.slow(1)  # its last call took long
    ready.started(1, "a", True)
    ready.ended(1, long=True, took_long=False)
    assert not ready.slow(1)


def test_an_endpoint_stays_slow_while_any_of_its_calls_is_long():
    ready = ReadyList()
    slow_endpoints(ready, {1: "a"})
    ready.started(1, "a", False)
    ready.ended(1, long=False, took_long=False)  # another call answered at once
    assert ready.slow(1)
    ready.ended(1, long=True, took_long=True)
    assert ready.slow(1)


def test_slow_endpoints_wait_for_long_slots_and_quick_ones_do_not():
    ready = ReadyList()
    slow_endpoints(ready, {1: "a", 2: "b"})
    ready.wake(3, 0, t(-1), NOW)
    assert ready.take(NOW, 10) == [Candidate(3, UNKNOWN)]
    assert ready.waiting_for_long() == 2
    assert ready.scheduled(1) and ready.scheduled(2)
    assert ready.next_due() is None  # a freed long slot wakes the worker, not a due
    assert ready.take(NOW, 10, 1) == [Candidate(1, t(-1), slow=True, cap=1)]
    assert ready.take(NOW, 10, 1) == [Candidate(2, t(-1), slow=True, cap=1)]
    assert ready.take(NOW, 10, 1) == []


def test_tenants_take_turns_for_long_slots_then_their_endpoints():
    ready = ReadyList()
    # Tenant "many" has four slow endpoints, "one" and "two" one each.
    slow_endpoints(ready, {1: "many", 2: "many", 3: "many", 4: "many", 5: "one", 6: "two"})
    assert ready.take(NOW, 0) == []
    order: list[int] = []
    for _ in range(6):
        (candidate,) = ready.take(NOW, 0, 1)
        order.append(candidate.endpoint_id)
        # served and due again at once: back into its tenant's line
        ready.settle([verdict(candidate.endpoint_id, head=t(-1))], [], NOW)
    assert order == [1, 5, 6, 2, 5, 6]


def test_a_wake_keeps_a_waiting_endpoints_place_in_line():
    ready = ReadyList()
    slow_endpoints(ready, {1: "a", 2: "a"})
    assert ready.take(NOW, 10) == []
    ready.wake(1, 0, t(-5), NOW)  # published to again
    ready.recorded([], [recorded_row(1, retried_head=t(-2))], NOW)
    assert ready.take(NOW, 10, 1) == [Candidate(1, t(-5), slow=True, cap=1)]


def test_an_endpoint_that_answers_quickly_again_leaves_the_line():
    ready = ReadyList()
    slow_endpoints(ready, {1: "a"})
    assert ready.take(NOW, 10) == []
    ready.ended(1, long=True, took_long=False)
    assert ready.waiting_for_long() == 1  # its old place is stale
    assert ready.take(NOW, 10) == [Candidate(1, t(-1))]
    assert ready.take(NOW, 10, 5) == []


def test_an_endpoint_holds_its_share_of_quick_slots_at_most():
    ready = ReadyList()
    listed(ready, {1: t(-1)})
    assert ready.take(NOW, 10, share=3) == [Candidate(1, t(-1), cap=3)]
    ready.settle([verdict(1, head=t(-1))], [(10, 1), (11, 1)], NOW)
    ready.started(1, "a", False)
    ready.started(1, "a", False)
    assert ready.take(NOW, 10, share=3) == [Candidate(1, t(-1), cap=1)]
    ready.settle([verdict(1, head=t(-1))], [(12, 1)], NOW)
    ready.started(1, "a", False)
    assert ready.take(NOW, 10, share=3) == []  # its share is held
    assert ready.scheduled(1)
    ready.went_long(1)  # one of them moved out of its quick slot
    assert ready.take(NOW, 10, share=3) == []  # slow now: it waits for a long slot
    assert ready.take(NOW, 10, 1, share=3) == [Candidate(1, t(-1), slow=True, cap=1)]


def test_a_call_past_the_threshold_that_keeps_its_quick_slot_makes_its_endpoint_slow_all_the_same():
    """The long budget's overdraft was taken: the call stays in its quick
    slot, its endpoint is slow, and after the call (which took the
    threshold) it is still slow, its quick slot given back once."""
    ready = ReadyList()
    listed(ready, {1: t(-1)})
    ready.take(NOW, 10, share=2)
    ready.settle([verdict(1, head=t(-1))], [(10, 1)], NOW)
    ready.started(1, "a", False)
    ready.went_long(1, moved=False)
    assert ready.slow(1)
    assert ready.take(NOW, 10, share=2) == []  # slow: it waits for a long slot
    ready.ended(1, long=False, took_long=True)
    assert ready.slow(1)
    assert ready.take(NOW, 10, 1, share=2) == [Candidate(1, t(-1), slow=True, cap=1)]


def test_a_quick_call_that_ends_brings_back_an_endpoint_at_its_share():
    ready = ReadyList()
    listed(ready, {1: t(-1)})
    ready.started(1, "a", False)
    assert ready.take(NOW, 10, share=1) == []
    ready.ended(1, long=False, took_long=False)
    assert ready.take(NOW, 10, share=1) == [Candidate(1, t(-1), cap=1)]


def test_a_result_of_a_tenant_at_its_ceiling_brings_back_its_held_endpoints():
    ready = ReadyList()
    listed(ready, {1: t(-1), 2: t(-1), 3: t(-1)})
    ready.take(NOW, 10)
    # 1 got the tenant's last call; 2 and 3 are held by the ceiling until
    # the first of its leases ends, an hour away
    ready.settle(
        [
            Verdict(1, True, True, None, t(-1), True, t(3600), "big"),
            Verdict(2, True, True, None, t(-1), True, t(3600), "big"),
            Verdict(3, True, True, None, t(-1), True, t(3600), "other"),
        ],
        [(10, 1)],
        NOW,
    )
    ready.started(1, "big", False)
    assert ready.due(2) == t(3600)
    assert ready.recorded([10], [recorded_row(1)], t(1))
    assert ready.due(2) == t(1)
    assert ready.due(3) == t(3600)  # another tenant's


@dataclass
class Round:
    candidates: list[Candidate]
    limit: int
    long_limit: int = 0
    reserved: list[tuple[int, int]] | None = None
    verdicts: list[Verdict] | None = None


@dataclass
class Notice:
    """A wake on its way (a publish committed: its notification), or a
    batch of results committed whose ``recorded`` call has not run yet."""

    tokens: set[int]
    endpoint: int = 0
    due: int | None = None
    deliveries: list[int] = field(default_factory=list)
    rows: list[Recorded] = field(default_factory=list)


class World:
    """The store, this worker's ready list, and what is on its way between
    them. Time in whole seconds from NOW."""

    def __init__(self) -> None:
        self.ready = ReadyList()
        self.clock = 0
        self.pending: dict[int, Pending] = {}  # delivery id: its pending spell
        self.sending: dict[int, tuple[int, int]] = {}  # this worker's: delivery id: (endpoint, lease end)
        self.in_hand: set[int] = set()  # reserved by a settled round, sent, no result committed
        # Reserved by a settled round, its ``recorded`` call not run yet: to
        # its endpoint, and whether its partition was released since.
        self.counted: dict[int, tuple[int, bool]] = {}
        self.limits = dict(LIMITS)
        self.others: dict[int, list[int]] = {e: [] for e in ENDPOINTS}  # other workers' lease ends
        self.paused: dict[int, int | None] = dict.fromkeys(ENDPOINTS)
        self.wakes: list[Notice] = []
        self.results: list[Notice] = []
        self.round: Round | None = None
        self.ids = 0
        # This worker's calls in the long budget (a subset of in_hand).
        self.long: set[int] = set()

    def now(self) -> datetime:
        return t(self.clock)

    def new_id(self) -> int:
        self.ids += 1
        return self.ids

    # The store, as the SQL of migration 0009 reads it.

    def live(self, endpoint: int) -> list[int]:
        ends = [end for e, end in self.sending.values() if e == endpoint] + self.others[endpoint]
        return [end for end in ends if end > self.clock]

    def from_floor(self, endpoint: int, floor: datetime | None) -> list[tuple[int, int]]:
        return sorted(
            (d.key, i)
            for i, d in self.pending.items()
            if d.endpoint == endpoint and (floor is UNKNOWN or t(d.key) >= floor)
        )

    def reserve_rows(self) -> None:
        """The reservation statement: due deliveries from each floor, never
        more than an endpoint's free slots, none while its circuit pauses,
        the first of each before the second of any, up to the limit."""
        assert self.round is not None
        queued = []
        for c in self.round.candidates:
            e = c.endpoint_id
            if self.paused[e] is not None and self.paused[e] > self.clock:
                continue
            free = max(self.limits[e] - len(self.live(e)), 0)
            if c.cap is not None:
                free = min(free, c.cap)
            due = [i for key, i in self.from_floor(e, c.floor) if key <= self.clock]
            queued += [(pos, i, e, c.slow) for pos, i in enumerate(due[:free])]
        # The limit is the quick candidates'; a slow one's cap is its own.
        chosen = [(pos, i, e) for pos, i, e, slow in sorted(queued) if not slow][: self.round.limit]
        chosen += [(pos, i, e) for pos, i, e, slow in queued if slow]
        for _, i, e in chosen:
            del self.pending[i]
            self.sending[i] = (e, self.clock + LEASE)
        self.round.reserved = [(i, e) for _, i, e in chosen]

    def judge(self) -> None:
        """The verdict statement, in a snapshot of its own."""
        assert self.round is not None
        verdicts = []
        for c in self.round.candidates:
            e = c.endpoint_id
            queue = self.from_floor(e, c.floor)
            live = self.live(e)
            verdicts.append(
                verdict(
                    e,
                    paused_until=None if self.paused[e] is None else t(self.paused[e]),
                    head=t(queue[0][0]) if queue else None,
                    at_limit=len(live) >= self.limits[e],
                    leases_end=t(min(live)) if live else None,
                )
            )
        self.round.verdicts = verdicts

    # What happens.

    def publish(self, endpoint: int, due: int) -> None:
        i, token = self.new_id(), self.new_id()
        self.pending[i] = Pending(endpoint, due, token)
        self.wakes.append(Notice({token}, endpoint=endpoint, due=due))

    def begin_round(self, limit: int, long_limit: int = 0, share: int | None = None) -> None:
        assert self.round is None
        dues = {e: self.ready.due(e) for e in ENDPOINTS}
        candidates = self.ready.take(self.now(), limit, long_limit, share)
        quick = [c for c in candidates if not c.slow]
        assert len(quick) <= limit
        assert len(candidates) - len(quick) <= long_limit
        assert len({c.endpoint_id for c in candidates}) == len(candidates)
        taken = [dues[c.endpoint_id] for c in candidates]
        assert all(d is not None and d <= self.now() for d in taken), taken
        assert [dues[c.endpoint_id] for c in quick] == sorted(dues[c.endpoint_id] for c in quick)  # type: ignore[type-var]
        if candidates:
            self.round = Round(candidates, limit, long_limit)

    def settle(self) -> None:
        assert self.round is not None and self.round.reserved is not None and self.round.verdicts is not None
        self.ready.settle(self.round.verdicts, self.round.reserved, self.now())
        slow = {c.endpoint_id for c in self.round.candidates if c.slow}
        for i, e in self.round.reserved:
            self.in_hand.add(i)
            self.counted[i] = (e, False)
            self.ready.started(e, TENANTS[e], e in slow)
            if e in slow:
                self.long.add(i)
        self.round = None

    def goes_long(self, i: int) -> None:
        """A call of this worker's runs past the threshold."""
        if i not in self.long:
            self.long.add(i)
            self.ready.went_long(self.sending[i][0])

    def answered(self, i: int, took_long: bool) -> None:
        self.ready.ended(self.sending[i][0], i in self.long, took_long)
        self.long.discard(i)

    def complete(
        self, outcomes: dict[int, int | None], opens: bool, took_long: dict[int, bool] | None = None
    ) -> None:
        """A batch of results committed: None delivered, else a retry in so
        many seconds; ``opens``: a failure opens the circuit for 45 s. Each
        call was answered first, in ``took_long`` time or not."""
        for i in outcomes:
            self.answered(i, (took_long or {}).get(i, False))
        tokens: set[int] = set()
        retried: dict[int, list[int]] = {}
        succeeded: set[int] = set()
        for i, retry_in in outcomes.items():
            e, _ = self.sending.pop(i)
            self.in_hand.remove(i)
            if retry_in is None:
                succeeded.add(e)
            else:
                token = self.new_id()
                tokens.add(token)
                self.pending[i] = Pending(e, self.clock + retry_in, token)
                retried.setdefault(e, []).append(self.clock + retry_in)
        rows = []
        for e in sorted(succeeded | retried.keys()):
            if e in succeeded:
                self.paused[e] = None
            elif opens:
                self.paused[e] = self.clock + 45
            paused = self.paused[e]
            rows.append(
                recorded_row(
                    e,
                    partition=ENDPOINTS[e],
                    paused_until=None if paused is None else t(paused),
                    retried_head=t(min(retried[e])) if e in retried else None,
                )
            )
        self.results.append(Notice(tokens, deliveries=list(outcomes), rows=rows))

    def notify(self, notice: Notice) -> None:
        if notice.rows:
            self.ready.recorded(notice.deliveries, notice.rows, self.now())
            for i in notice.deliveries:
                self.counted.pop(i, None)
        else:
            due = None if notice.due is None else t(notice.due)
            self.ready.wake(notice.endpoint, ENDPOINTS[notice.endpoint], due, self.now())
        for d in self.pending.values():
            if d.token in notice.tokens:
                d.announced = True

    def rescan(self, partitions: set[int]) -> None:
        """Every endpoint of ``partitions`` with a pending delivery, with
        its head read from the start (store.pending_endpoints)."""
        heads: dict[int, int] = {}
        for d in self.pending.values():
            if ENDPOINTS[d.endpoint] in partitions:
                heads[d.endpoint] = min(d.key, heads.get(d.endpoint, d.key))
        for e, head in sorted(heads.items()):
            self.ready.listed(e, ENDPOINTS[e], t(head), self.now())
        for d in self.pending.values():
            if ENDPOINTS[d.endpoint] in partitions:
                d.announced = True

    def pass_time(self, seconds: int) -> None:
        sweeps = (self.clock + seconds) // SWEEP - self.clock // SWEEP
        self.clock += seconds
        if sweeps:
            self.rescan(set(ENDPOINTS.values()))

    def release_and_take(self, partition: int) -> None:
        assert self.round is None
        self.ready.retain(set(ENDPOINTS.values()) - {partition})  # a round runs without it
        self.ready.retain(set(ENDPOINTS.values()))  # and the next with it again
        for i, (e, _) in self.counted.items():
            if ENDPOINTS[e] == partition:
                self.counted[i] = (e, True)
        self.rescan({partition})

    def drain(self) -> None:
        """Every notification arrives, every delivery sent is delivered, the
        rounds run, time runs on to the next due: until nothing is due."""
        if self.round is not None:
            if self.round.reserved is None:
                self.reserve_rows()
            if self.round.verdicts is None:
                self.judge()
            self.settle()
        for _ in range(1000):
            while self.wakes or self.results:
                self.notify((self.wakes or self.results).pop(0))
            if self.in_hand:
                self.complete(dict.fromkeys(sorted(self.in_hand)), opens=False)
                continue
            self.begin_round(100, 100, 1)
            if self.round is not None:
                self.reserve_rows()
                self.judge()
                self.settle()
                continue
            due = self.ready.next_due()
            if due is None or due <= self.now():
                return
            self.clock = max(self.clock, math.ceil((due - NOW).total_seconds()))


class ReadyListModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.world = World()

    @rule(endpoint=st.sampled_from(sorted(ENDPOINTS)), age=st.integers(0, 90))
    def publish(self, endpoint, age):
        """A delivery committed, written at its transaction's now(): ``age``
        seconds ago when the transaction was held open that long."""
        self.world.publish(endpoint, self.world.clock - age)

    @precondition(lambda self: self.world.wakes)
    @rule()
    def notification_arrives(self):
        self.world.notify(self.world.wakes.pop(0))

    @precondition(lambda self: self.world.round is None)
    @rule(limit=st.integers(0, 4), long_limit=st.integers(0, 2), share=st.none() | st.integers(1, 2))
    def round_begins(self, limit, long_limit, share):
        self.world.begin_round(limit, long_limit, share)

    @precondition(lambda self: self.world.round is not None)
    @rule()
    def round_goes_on(self):
        """Its reservation statement, then its verdict statement (a snapshot
        of its own), then the worker settles it."""
        w = self.world
        assert w.round is not None
        if w.round.reserved is None:
            w.reserve_rows()
        elif w.round.verdicts is None:
            w.judge()
        else:
            w.settle()

    @precondition(lambda self: self.world.round is not None and self.world.round.reserved is None)
    @rule()
    def round_fails(self):
        self.world.ready.returned(self.world.round.candidates, self.world.now())
        self.world.round = None

    @precondition(lambda self: self.world.in_hand and not self.world.results)
    @rule(data=st.data(), opens=st.booleans())
    def results_committed(self, data, opens):
        """A batch of results of deliveries sent committed (the recorder
        writes one batch at a time); its ``recorded`` call comes later."""
        ids = data.draw(st.lists(st.sampled_from(sorted(self.world.in_hand)), min_size=1, unique=True))
        took_long = {i: data.draw(st.booleans()) for i in ids}
        self.world.complete({i: data.draw(st.none() | st.integers(1, 60)) for i in ids}, opens, took_long)

    @precondition(lambda self: self.world.in_hand - self.world.long)
    @rule(data=st.data())
    def a_call_runs_long(self, data):
        self.world.goes_long(data.draw(st.sampled_from(sorted(self.world.in_hand - self.world.long))))

    @precondition(lambda self: self.world.results)
    @rule()
    def results_applied(self):
        self.world.notify(self.world.results.pop(0))

    @precondition(lambda self: not self.world.results)  # recorded right after complete returns
    @rule(seconds=st.integers(1, 30))
    def time_passes(self, seconds):
        """Time runs on; every SWEEP seconds the sweep runs, in a round or not."""
        self.world.pass_time(seconds)

    @rule(
        event=st.sampled_from(
            ["limit changed", "another worker reserves", "another worker is done", "partition moves"]
        ),
        endpoint=st.sampled_from(sorted(ENDPOINTS)),
        n=st.integers(1, 120),
    )
    def elsewhere(self, event, endpoint, n):
        """What the list hears of late or not at all: an endpoint's limit
        changed (upsert_endpoint wakes it, nothing written); a slot taken by
        another worker, for up to ``n`` seconds, or freed by it early
        (nothing tells this worker); the endpoint's partition released and
        taken again (between rounds)."""
        w = self.world
        if event == "limit changed":
            w.limits[endpoint] = 1 + n % 3
            w.wakes.append(Notice(set(), endpoint=endpoint))
        elif event == "another worker reserves" and len(w.live(endpoint)) < w.limits[endpoint]:
            w.others[endpoint].append(w.clock + n)
        elif event == "another worker is done" and w.others[endpoint]:
            w.others[endpoint].pop()
        elif event == "partition moves" and w.round is None:
            w.release_and_take(ENDPOINTS[endpoint])

    # What always holds.

    @invariant()
    def every_endpoint_held_has_its_floor_under_its_partition(self):
        assert len(self.world.ready.floors(set(ENDPOINTS.values()))) == len(self.world.ready)

    @invariant()
    def no_delivery_is_below_its_floor(self):
        w = self.world
        for i, d in w.pending.items():
            if d.announced:
                floor = w.ready.floor(d.endpoint)
                assert floor is UNKNOWN or t(d.key) >= floor, (
                    f"delivery {i} of endpoint {d.endpoint} at {d.key} s, below the floor {floor - NOW}"
                )

    @invariant()
    def an_endpoint_with_a_due_delivery_is_scheduled(self):
        w = self.world
        for i, d in w.pending.items():
            if d.announced and d.key <= w.clock:
                assert w.ready.scheduled(d.endpoint), (
                    f"delivery {i} of endpoint {d.endpoint} is due, unscheduled"
                )

    @invariant()
    def an_endpoint_with_a_long_call_is_slow(self):
        """Unless its partition was released since (the list forgot it)."""
        w = self.world
        for i in w.long:
            endpoint, released = w.counted[i]
            assert released or w.ready.slow(endpoint), f"endpoint {endpoint} has call {i} long, not slow"

    @invariant()
    def busy_counts_what_this_worker_holds(self):
        """Deliveries reserved and not yet recorded, but for those reserved
        before the endpoint's partition was released: their slots are now
        another worker's to the list (live leases)."""
        w = self.world
        for e in ENDPOINTS:
            assert w.ready.busy(e) == sum(
                owner == e and not released for owner, released in w.counted.values()
            )

    @invariant()
    def everything_pending_would_go_through(self):
        """Were every notification to arrive and every delivery sent to be
        delivered, the rounds would leave nothing pending, with no sweep to
        repair what the list lost."""
        w = copy.deepcopy(self.world, {id(NOTHING): NOTHING})  # the list tells NOTHING by identity
        w.drain()
        assert not w.pending, f"never delivered, at {w.clock} s: {w.pending}"


TestReadyListModel = ReadyListModel.TestCase
TestReadyListModel.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)

"""The ready list: which endpoints of a worker's partitions may have work,
from when, and where each one's queue starts.

The partition owner keeps it in memory, where it costs Postgres no row
version (issue 21: while another session holds the xmin horizon back, every
version a table of it gets stays, and every scan walks them). It is built
from Postgres when partitions are taken (``store.pending_endpoints``), told
of new work by the commit probe (publishes: hooklane/worker/commits.py) and
by notifications (resends, replays, endpoint changes, retries recorded by
another worker: ``parse_wakeup``), and judged
by what each reservation round and batch of results returns. The rules are
in docs/state-machine.md, "Ready endpoints".

Per endpoint it holds:

- ``due``: when a round should visit it (None: not until something happens);
- ``floor``: the earliest ``next_attempt_at`` a pending delivery of it may
  have. A round reads the endpoint's queue from there, so that the entries of
  the deliveries it sent before (dead versions while the horizon is held)
  are not walked again. ``UNKNOWN`` reads from the start; ``NOTHING`` means
  nothing is pending that the list was not told of;
- ``busy``: deliveries this worker reserved for it and has not recorded;
- its class (hooklane/worker/slots.py): *slow* while a call of it is in
  the worker's long budget, or since its last call answered after the
  threshold. A slow endpoint that is due waits in its tenant's line for a
  long slot: tenants take turns, one call each, then each tenant's
  endpoints take turns, so that when long slots are short a tenant gets a
  tenant's share, not one per endpoint it has.

Pure: no I/O, no clock of its own (every call is given ``now``).
"""

from __future__ import annotations

import heapq
import re
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from hooklane.results import Recorded, Verdict

# Floors: a time, or one of these two.
UNKNOWN: datetime | None = None
NOTHING = datetime.max.replace(tzinfo=UTC)

# How long an endpoint whose slots are all held by another worker's live
# leases waits, at most, before it is looked at again when the round did
# not say when the first lease ends.
_HELD_ELSEWHERE = timedelta(seconds=1)

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
# Before any time a delivery is due: read a queue from its start.
_START = datetime.min.replace(tzinfo=UTC)


def lower(floor: datetime | None, due: datetime | None) -> datetime | None:
    """The floor after a pending delivery due from ``due`` was written
    (``due`` None: unknown, read from the start)."""
    if floor is None or due is None:
        return UNKNOWN
    return min(floor, due)


@dataclass(frozen=True)
class Wakeup:
    """A notification on ``hooklane_ready``: endpoints of a partition may
    have work due from ``due`` (None: nothing was written, the endpoint
    changed)."""

    partition: int
    due: datetime | None
    endpoints: tuple[int, ...]


_PAYLOAD = re.compile(r"(\d{1,10}) (-|-?\d{1,19}) (\d{1,19}(?:,\d{1,19})*)")


def parse_wakeup(payload: str) -> Wakeup | None:
    """A notification's payload, as hooklane_wake_v2 writes it ("<partition>
    <due in microseconds since the epoch, or -> <id>,<id>,..."); None for
    anything else, which is not ours."""
    match = _PAYLOAD.fullmatch(payload)
    if match is None or not payload.isascii():
        return None
    partition, when, ids = match.groups()
    due = None
    if when != "-":
        try:
            due = _EPOCH + timedelta(microseconds=int(when))
        except OverflowError:
            return None
    return Wakeup(int(partition), due, tuple(int(i) for i in ids.split(",")))


@dataclass(frozen=True)
class Candidate:
    endpoint_id: int
    floor: datetime | None
    # Of the slow class: one delivery at most, in a long slot.
    slow: bool = False
    # The most deliveries a round may give it (None: its free slots).
    cap: int | None = None


@dataclass
class _Entry:
    partition: int
    floor: datetime | None = UNKNOWN
    due: datetime | None = None
    busy: int = 0
    # All its slots are taken by this worker's own deliveries: a recorded
    # result brings it back.
    waiting: bool = False
    # Handed to a round whose verdict has not come back yet; ``woken``: told
    # of work meanwhile, from ``woken_floor`` on; ``changed``: told that the
    # endpoint changed.
    in_round: bool = False
    woken: bool = False
    woken_floor: datetime | None = NOTHING
    changed: bool = False
    stamp: int = 0
    # Its class: its calls in the long budget now, and whether it is slow.
    long_calls: int = 0
    slow: bool = False
    tenant: str = ""
    # Due, slow, and in its tenant's line for a long slot (``_lines``).
    deferred: bool = False
    # Its calls in quick slots now; ``over_share``: due, and holding its
    # share of them, until one ends or runs long.
    quick_calls: int = 0
    over_share: bool = False


class ReadyList:
    def __init__(self) -> None:
        self._entries: dict[int, _Entry] = {}
        # The same endpoints by partition, kept with them (``_add``,
        # ``_forget``, ``retain``): a gauge slice's floors read its own
        # partitions' entries, not every entry of the list.
        self._by_partition: dict[int, set[int]] = {}
        # (due, stamp, endpoint): an entry is current while its endpoint's
        # stamp and due still say so; others are skipped when they surface.
        # One heap per class.
        self._heap: list[tuple[datetime, int, int]] = []
        self._slow_heap: list[tuple[datetime, int, int]] = []
        # The slow endpoints that are due, by tenant, in turn order: each
        # line holds (endpoint, stamp), current as the heaps' entries are.
        self._lines: OrderedDict[str, deque[tuple[int, int]]] = OrderedDict()
        self._in_lines = 0
        # The endpoints a tenant's ceiling held back, by tenant: a result of
        # that tenant recorded here brings them back before their leases_end.
        self._held: dict[str, set[int]] = {}
        self._stamps = 0
        # This worker's reserved deliveries not yet recorded, to their endpoint.
        self._reserved: dict[int, int] = {}
        # The partitions owned, once ``retain`` said (None: not yet known).
        self._partitions: set[int] | None = None

    def __len__(self) -> int:
        return len(self._entries)

    def _add(self, endpoint_id: int, entry: _Entry) -> _Entry:
        self._entries[endpoint_id] = entry
        self._by_partition.setdefault(entry.partition, set()).add(endpoint_id)
        return entry

    def _forget(self, endpoint_id: int) -> None:
        partition = self._entries.pop(endpoint_id).partition
        held = self._by_partition[partition]
        held.discard(endpoint_id)
        if not held:
            del self._by_partition[partition]

    def busy(self, endpoint_id: int) -> int:
        entry = self._entries.get(endpoint_id)
        return entry.busy if entry else 0

    def floor(self, endpoint_id: int) -> datetime | None:
        entry = self._entries.get(endpoint_id)
        return entry.floor if entry else UNKNOWN

    def due(self, endpoint_id: int) -> datetime | None:
        entry = self._entries.get(endpoint_id)
        return entry.due if entry else None

    def floors(self, partitions: Iterable[int]) -> dict[int, datetime]:
        """Where the health query may start counting the pending deliveries
        of each endpoint of ``partitions`` the list holds: its floor, or the
        start of time when that is UNKNOWN. An endpoint left out has nothing
        pending that the list was told of."""
        return {
            k: self._entries[k].floor or _START for p in partitions for k in self._by_partition.get(p, ())
        }

    def mark(self) -> int:
        """Where the list's changes stand, for ``lost``."""
        return self._stamps

    def lost(self, endpoint_id: int, mark: int) -> bool:
        """Not scheduled, and not handled since ``mark``: what a listing read
        after ``mark`` may call lost. One settled meanwhile (its delivery
        reserved, nothing left: no due) was handled after the listing's
        snapshot, which still showed it pending."""
        entry = self._entries.get(endpoint_id)
        return entry is None or (entry.stamp <= mark and not self.scheduled(endpoint_id))

    def scheduled(self, endpoint_id: int) -> bool:
        """Whether a round is to visit the endpoint: at a time, in one now,
        or once a result frees a slot."""
        entry = self._entries.get(endpoint_id)
        return entry is not None and (
            entry.due is not None or entry.waiting or entry.in_round or entry.over_share
        )

    # What happened outside a round.

    def wake(self, endpoint_id: int, partition: int, due: datetime | None, now: datetime) -> None:
        """The endpoint may have work: pending deliveries due from ``due``
        (None: none written, but something of the endpoint changed)."""
        entry = self._entries.get(endpoint_id)
        if entry is None:
            entry = self._add(endpoint_id, _Entry(partition))
        if due is None:
            # The endpoint changed (a higher limit, say), or the sweep: a
            # round judges it again even if it waits for a slot. A publish
            # to an endpoint whose slots this worker holds does not: only a
            # recorded result frees one.
            entry.waiting = False
        if due is not None:
            entry.floor = lower(entry.floor, due)
        if entry.in_round:
            entry.woken = True
            entry.changed = entry.changed or due is None
            if due is not None:
                entry.woken_floor = lower(entry.woken_floor, due)
            return
        if entry.deferred:
            return  # due already, in its line: a wake would only lose its place
        at = max(due, now) if due is not None else now
        self._schedule(entry, endpoint_id, at if entry.due is None else min(entry.due, at))

    def listed(
        self, endpoint_id: int, partition: int, head: datetime, now: datetime, *, from_start: bool = True
    ) -> None:
        """The database lists the endpoint with pending deliveries from
        ``head`` on, the earliest of them (a partition taken, the sweep):
        its floor is at most that, and it is looked at by then. A floor below
        the head stays where it is, so the rounds after a sweep do not read
        every queue from its start again. A head not
        read from the queue's start (``from_start`` false: the sweep read
        from its last run on) says nothing of what lies before it: an
        endpoint the list did not know starts with its floor unknown."""
        entry = self._entries.get(endpoint_id)
        if entry is None:
            entry = self._add(endpoint_id, _Entry(partition, floor=head if from_start else UNKNOWN))
        entry.waiting = False  # judged again, even if it waits for a slot
        self.wake(endpoint_id, partition, head, now)

    def retain(self, partitions: set[int]) -> None:
        """Forget the endpoints of partitions this worker no longer owns, and
        its deliveries in flight to them: if a partition comes back, their
        slots are another worker's to it (live leases), not this list's."""
        self._partitions = set(partitions)
        self._entries = {k: e for k, e in self._entries.items() if e.partition in partitions}
        self._by_partition = {p: ids for p, ids in self._by_partition.items() if p in partitions}
        self._reserved = {d: k for d, k in self._reserved.items() if k in self._entries}
        self._rebuild()

    # The rounds.

    def take(
        self, now: datetime, limit: int, long_limit: int = 0, share: int | None = None
    ) -> list[Candidate]:
        """Up to ``limit`` quick endpoints whose time has come, longest
        waiting first, each capped to hold ``share`` quick slots at most
        (None: no share), and up to ``long_limit`` slow ones, tenants
        taking turns: all now handed to a round."""
        taken: list[Candidate] = []
        while self._heap and len(taken) < limit and self._heap[0][0] <= now:
            endpoint_id = self._pop_current(self._heap)
            if endpoint_id is None:
                continue
            entry = self._entries[endpoint_id]
            if share is not None and entry.quick_calls >= share:
                entry.over_share = True  # a call of it that ends or runs long brings it back
                continue
            cap = None if share is None else share - entry.quick_calls
            taken.append(self._hand(endpoint_id, slow=False, cap=cap))
        while self._slow_heap and self._slow_heap[0][0] <= now:
            endpoint_id = self._pop_current(self._slow_heap)
            if endpoint_id is not None:
                self._line_up(endpoint_id)
        slow = 0
        while slow < long_limit and self._lines:
            tenant, line = self._lines.popitem(last=False)
            self._in_lines -= len(line)
            while line:
                endpoint_id, stamp = line.popleft()
                waiting = self._entries.get(endpoint_id)
                if waiting is not None and waiting.stamp == stamp and waiting.deferred:
                    taken.append(self._hand(endpoint_id, slow=True, cap=1))
                    slow += 1
                    break
            if line:
                self._lines[tenant] = line  # the back of the turns
                self._in_lines += len(line)
        return taken

    def waiting_for_long(self) -> int:
        """Slow endpoints due and waiting for a long slot (an upper bound:
        a line may still hold an endpoint that was scheduled anew)."""
        return self._in_lines

    def _pop_current(self, heap: list[tuple[datetime, int, int]]) -> int | None:
        due, stamp, endpoint_id = heapq.heappop(heap)
        entry = self._entries.get(endpoint_id)
        if entry is None or entry.stamp != stamp or entry.due != due or entry.deferred:
            return None
        return endpoint_id

    def _hand(self, endpoint_id: int, *, slow: bool, cap: int | None) -> Candidate:
        entry = self._entries[endpoint_id]
        entry.in_round, entry.woken, entry.woken_floor, entry.changed = True, False, NOTHING, False
        entry.deferred = False
        return Candidate(endpoint_id, entry.floor, slow, cap)

    def _line_up(self, endpoint_id: int) -> None:
        entry = self._entries[endpoint_id]
        entry.deferred = True
        line = self._lines.get(entry.tenant)
        if line is None:
            line = self._lines[entry.tenant] = deque()
        line.append((endpoint_id, entry.stamp))
        self._in_lines += 1
        if self._in_lines > 4 * len(self._entries) + 1024:
            self._rebuild()

    def next_due(self) -> datetime | None:
        """When the earliest scheduled endpoint is due (those in a line for
        a long slot are due already: a freed long slot wakes the worker)."""
        dues = [d for d in (self._heap_due(self._heap), self._heap_due(self._slow_heap)) if d is not None]
        return min(dues, default=None)

    def _heap_due(self, heap: list[tuple[datetime, int, int]]) -> datetime | None:
        while heap:
            due, stamp, endpoint_id = heap[0]
            entry = self._entries.get(endpoint_id)
            if entry is not None and entry.stamp == stamp and entry.due == due and not entry.deferred:
                return due
            heapq.heappop(heap)
        return None

    # The calls' classes (hooklane/worker/slots.py).

    def started(self, endpoint_id: int, tenant: str, long: bool) -> None:
        """A call of the endpoint starts, in the long budget or not."""
        entry = self._entries.get(endpoint_id)
        if entry is not None:
            entry.tenant = tenant
            if long:
                entry.long_calls += 1
                self._classify(endpoint_id, entry, slow=True)
            else:
                entry.quick_calls += 1

    def went_long(self, endpoint_id: int, *, moved: bool = True) -> None:
        """A call of the endpoint ran past the threshold: it is slow. The
        call moved to the long budget, or (``moved`` False: the budget's
        overdraft was taken) kept its quick slot."""
        entry = self._entries.get(endpoint_id)
        if entry is not None:
            if moved:
                entry.long_calls += 1
                self._left_quick(endpoint_id, entry)
            self._classify(endpoint_id, entry, slow=True)

    def ended(self, endpoint_id: int, long: bool, took_long: bool) -> None:
        """A call of the endpoint ended: it was in the long budget or not,
        and took the threshold's time or more, or less. An endpoint that
        answers quickly is quick again once no call of it is long."""
        entry = self._entries.get(endpoint_id)
        if entry is not None:
            if long:
                entry.long_calls = max(entry.long_calls - 1, 0)
            else:
                self._left_quick(endpoint_id, entry)
            self._classify(endpoint_id, entry, slow=entry.long_calls > 0 or took_long)

    def _left_quick(self, endpoint_id: int, entry: _Entry) -> None:
        entry.quick_calls = max(entry.quick_calls - 1, 0)
        if entry.over_share:
            self._schedule(entry, endpoint_id, entry.due)

    def slow(self, endpoint_id: int) -> bool:
        entry = self._entries.get(endpoint_id)
        return entry is not None and entry.slow

    def _classify(self, endpoint_id: int, entry: _Entry, *, slow: bool) -> None:
        if entry.slow != slow:
            entry.slow = slow
            # Into the other class's heap (out of a line for a long slot).
            self._schedule(entry, endpoint_id, entry.due)

    def returned(self, candidates: Iterable[Candidate], now: datetime) -> None:
        """A round failed before its verdicts: its candidates are due again."""
        for candidate in candidates:
            entry = self._entries.get(candidate.endpoint_id)
            if entry is not None and entry.in_round:
                entry.in_round = False
                if entry.woken:
                    entry.floor = lower(entry.floor, entry.woken_floor) if entry.woken_floor else UNKNOWN
                self._schedule(entry, candidate.endpoint_id, now)

    def settle(self, verdicts: Iterable[Verdict], reserved: Iterable[tuple[int, int]], now: datetime) -> None:
        """Apply a round: ``reserved`` is (delivery, endpoint) of each
        delivery it reserved, ``verdicts`` one per candidate."""
        for delivery_id, endpoint_id in reserved:
            entry = self._entries.get(endpoint_id)
            if entry is not None:
                entry.busy += 1
                self._reserved[delivery_id] = endpoint_id
        for v in verdicts:
            entry = self._entries.get(v.endpoint_id)
            if entry is None or not entry.in_round:
                continue
            entry.in_round = False
            if not v.exists and not entry.woken:
                self._forget(v.endpoint_id)
                continue
            if v.held_by is not None:
                self._held.setdefault(v.held_by, set()).add(v.endpoint_id)
            if v.deliverable:
                entry.floor = v.head if v.head is not None else NOTHING
            if entry.woken:
                entry.floor = lower(entry.floor, entry.woken_floor) if entry.woken_floor else UNKNOWN
            entry.waiting = False
            # A publish meanwhile is for the next round, unless the endpoint
            # waits for a slot of this worker's, which only a result frees.
            held = v.deliverable and v.at_limit and entry.busy > 0 and not entry.changed
            if entry.woken and not held:
                due: datetime | None = now
            elif not v.deliverable or entry.floor is NOTHING:
                due = None
            elif v.paused_until is not None and v.paused_until > now:
                due = max(v.paused_until, entry.floor or now)
            elif v.at_limit and entry.busy > 0:
                entry.waiting, due = True, None
            elif v.at_limit:
                due = v.leases_end or now + _HELD_ELSEWHERE
            else:
                due = max(entry.floor or now, now)
            self._schedule(entry, v.endpoint_id, due)

    def recorded(self, deliveries: Iterable[int], endpoints: Iterable[Recorded], now: datetime) -> bool:
        """Apply a batch of results: ``deliveries`` were recorded (or fenced
        off), freeing their slots; ``endpoints`` is how each touched endpoint
        was left. True if one is due now: a round is worth running at once."""
        freed: set[int] = set()
        for delivery_id in deliveries:
            owner = self._reserved.pop(delivery_id, None)
            entry = self._entries.get(owner) if owner is not None else None
            if owner is not None and entry is not None:
                entry.busy = max(entry.busy - 1, 0)
                freed.add(owner)
        for tenant in {self._entries[k].tenant for k in freed}:
            freed |= self._held.pop(tenant, set())
        left = {r.endpoint_id: r for r in endpoints}
        for forgotten in left.values():
            r_id, r_partition = forgotten.endpoint_id, forgotten.partition
            if r_id not in self._entries and forgotten.retried_head is not None and self._owns(r_partition):
                # Forgotten with its partition, which came back without it
                # (nothing of it was pending then): only this result tells
                # of the retry, as its owner is notified only when it is
                # another worker.
                self._add(r_id, _Entry(r_partition, floor=NOTHING))
        ready_now = False
        for endpoint_id in freed | left.keys():
            entry = self._entries.get(endpoint_id)
            if entry is None:
                continue
            r = left.get(endpoint_id)
            if r is not None and r.retried_head is not None:
                entry.floor = lower(entry.floor, r.retried_head)
                if entry.in_round:
                    entry.woken, entry.woken_floor = True, lower(entry.woken_floor, r.retried_head)
            if entry.in_round:
                # The round's verdict decides, but it may have counted a
                # slot this result freed: it is to look again.
                entry.woken = entry.changed = True
                continue
            entry.waiting = False
            if entry.deferred or entry.floor is NOTHING or (r is not None and not r.deliverable):
                continue
            at = max(entry.floor or now, now)
            if r is not None and r.paused_until is not None and r.paused_until > now:
                due: datetime | None = max(r.paused_until, at)
            else:
                due = at if entry.due is None else min(entry.due, at)
            self._schedule(entry, endpoint_id, due)
            ready_now = ready_now or (due is not None and due <= now)
        return ready_now

    def _owns(self, partition: int) -> bool:
        return self._partitions is not None and partition in self._partitions

    # The heap.

    def _schedule(self, entry: _Entry, endpoint_id: int, due: datetime | None) -> None:
        entry.due = due
        entry.deferred = entry.over_share = False
        self._stamps += 1
        entry.stamp = self._stamps
        if due is not None and not entry.waiting and not entry.in_round:
            heapq.heappush(self._slow_heap if entry.slow else self._heap, (due, entry.stamp, endpoint_id))
            if len(self._heap) + len(self._slow_heap) > 4 * len(self._entries) + 1024:
                self._rebuild()

    def _rebuild(self) -> None:
        """The heaps and lines of the current entries only; the lines keep
        their order."""
        scheduled = [
            (e.due, e.stamp, k, e.slow)
            for k, e in self._entries.items()
            if e.due is not None and not e.waiting and not e.in_round and not e.deferred and not e.over_share
        ]
        self._heap = [(due, stamp, k) for due, stamp, k, slow in scheduled if not slow]
        self._slow_heap = [(due, stamp, k) for due, stamp, k, slow in scheduled if slow]
        heapq.heapify(self._heap)
        heapq.heapify(self._slow_heap)
        lines: OrderedDict[str, deque[tuple[int, int]]] = OrderedDict()
        for tenant, line in self._lines.items():
            kept = deque(
                (k, stamp)
                for k, stamp in line
                if (e := self._entries.get(k)) is not None and e.stamp == stamp and e.deferred
            )
            if kept:
                lines[tenant] = kept
        self._lines = lines
        self._in_lines = sum(len(line) for line in lines.values())

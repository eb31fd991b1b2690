"""A worker's capacity for calls in flight, in two classes.

Every call starts in a *quick* slot (``HOOKLANE_WORKER_CONCURRENCY`` of
them). One still unanswered after ``HOOKLANE_LONG_CALL_SECONDS`` moves to
the *long* budget (``HOOKLANE_WORKER_LONG_CALLS``) and gives its quick slot
back, so that a quick slot is never held longer than that, however many
receivers turn slow at once: a call holding a slot for 4 s would otherwise
cost the others as much as 400 calls of 10 ms, and a hundred slow receivers
at their default limit take every slot a worker has (issue 39). The calls
of an endpoint known to be slow (the ready list's class) start in the long
budget directly, and only while it has room; they wait rather than borrow
quick slots.

When the quick slots are nearly all taken (``pressed``), a call moves
sooner, after a tenth of the threshold: many receivers turning slow at the
same moment would otherwise hold every quick slot for the threshold's
time, one call each, before any is known slow (1,620 endpoints at 0.25 s
took the 256 slots for over a second and a half).

Pure: no I/O, no clock. The worker says when a call starts, moves and ends.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass


@dataclass
class Call:
    """A call in flight: whose, and in which class now."""

    endpoint_id: int
    tenant: str
    long: bool
    ended: bool = False


# An endpoint holds this share of the quick slots at most: one that turns
# slow with a large maxConcurrency (a tenant's own choice, up to its
# bounds) would otherwise take them all for the threshold's time, in one
# round, before it is known slow.
QUICK_SHARE = 4

# A call past the threshold moves to the long budget even when the budget
# is full: it is running, and its quick slot is for the calls that answer.
# Up to this many times the budget in all; beyond, it keeps its quick slot.
# So a worker holds quick + LONG_OVERDRAFT x long calls at most, the sockets
# its open-files limit is raised to (runner._long_calls_allowed): 1,620
# receivers turning slow at once took the long class to 1,484 of 1,024.
LONG_OVERDRAFT = 2

# The quick slots are pressed when fewer than this share of them is free.
PRESSED_SHARE = 8
# Pressed, a call moves after this share of the threshold.
HURRIED_SHARE = 10


class Slots:
    def __init__(self, quick: int, long: int) -> None:
        self.quick = quick
        self.long = long
        # The quick slots one endpoint may hold at once.
        self.share = max(quick // QUICK_SHARE, 1)
        self.quick_in_flight = 0
        self.long_in_flight = 0
        self._tenants: dict[str, int] = {}

    def pressed(self) -> bool:
        """Whether the quick slots are nearly all taken: calls running for
        a tenth of the threshold move then, not at the threshold."""
        return self.quick_free() < max(self.quick // PRESSED_SHARE, 1)

    def quick_free(self) -> int:
        return max(self.quick - self.quick_in_flight, 0)

    def long_free(self) -> int:
        return max(self.long - self.long_in_flight, 0)

    def start(self, endpoint_id: int, tenant: str, long: bool) -> Call:
        """A call reserved: in the long budget if its endpoint is slow."""
        if long:
            self.long_in_flight += 1
        else:
            self.quick_in_flight += 1
        self._tenants[tenant] = self._tenants.get(tenant, 0) + 1
        return Call(endpoint_id, tenant, long)

    def went_long(self, call: Call) -> bool:
        """The call ran past the threshold: its quick slot is free. True if
        it moved (False: it was long already, has ended, or the long class
        holds its overdraft already)."""
        if call.long or call.ended or self.long_in_flight >= self.long * LONG_OVERDRAFT:
            return False
        call.long = True
        self.quick_in_flight -= 1
        self.long_in_flight += 1
        return True

    def done(self, call: Call) -> None:
        call.ended = True
        if call.long:
            self.long_in_flight -= 1
        else:
            self.quick_in_flight -= 1
        left = self._tenants[call.tenant] - 1
        if left:
            self._tenants[call.tenant] = left
        else:
            del self._tenants[call.tenant]

    def top_tenants(self, n: int) -> list[tuple[str, int]]:
        """The ``n`` tenants with the most calls in flight here, most first:
        what the per-tenant gauge shows, its cardinality bounded."""
        return heapq.nlargest(n, self._tenants.items(), key=lambda item: (item[1], item[0]))

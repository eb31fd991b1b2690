"""Whatever a receiver sends ends as a recorded attempt (issue 7): each mode
of testsupport/hostile.py against a real worker, real Postgres and raw sockets on
loopback."""

from __future__ import annotations

import errno
import gc
import socket
import ssl
import time
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta

import aiohttp
import psutil
import pytest
from aiohttp.client_reqrep import ConnectionKey

import hooklane
from hooklane.worker.rules import RetryPolicy
from hooklane.worker.sender import failure_class
from testsupport.fixtures import add_endpoint, wait_for
from testsupport.hostile import (
    GARBAGE_HEADER_ANSWERS,
    GARBAGE_STATUS_LINES,
    RETRY_AFTER_VALUES,
    HostileServer,
)
from testsupport.receivers import Answer

pytestmark = pytest.mark.chaos

TIMEOUT = 1
TIMED_OUT = f"timeout: no response within {TIMEOUT} s"
# What a tenant may read for each mode. Modes whose answers vary may be
# refused by aiohttp's parser or passed through to the rules; both are fine
# as long as what is stored is one of these.
EXPECTED: dict[str, set[str]] = {
    "hang": {TIMED_OUT},
    "trickle": {TIMED_OUT},
    "slow_headers": {TIMED_OUT},
    "endless_headers": {"invalid response"},
    "close_after_headers": {"HTTP 500"},
    "reset": {"connection failed"},
    "garbage_retry_after": {"HTTP 503"},
    "garbage_headers": {"HTTP 503", "invalid response"},
    "garbage_status": {"HTTP 503", "invalid response", "invalid response: status out of range"},
    "http09": {"invalid response"},
    "not_http": {"invalid response"},
}
# One delivery per value, so that every value is seen once.
DELIVERIES = {
    "garbage_retry_after": len(RETRY_AFTER_VALUES),
    "garbage_headers": len(GARBAGE_HEADER_ANSWERS),
    "garbage_status": len(GARBAGE_STATUS_LINES),
}
MEMORY_BOUND = 50 * 1024 * 1024


@pytest.fixture
async def hostile() -> AsyncIterator[HostileServer]:
    async with HostileServer() as server:
        yield server


@pytest.fixture(scope="module")
def figures(request: pytest.FixtureRequest) -> Iterator[list[str]]:
    """Time to record and memory per mode, shown once at the end."""
    lines: list[str] = []
    yield lines
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None or not lines:
        return
    # Module teardown runs inside the last test's capture.
    with capture.global_and_fixture_disabled():
        reporter.write_line("")
        reporter.write_line("hostile receivers:")
        for line in lines:
            reporter.write_line("  " + line)


def test_every_mode_is_tested():
    assert set(EXPECTED) | {"huge_body"} == set(HostileServer.MODES)


async def _publish(db, n: int) -> None:
    for i in range(n):
        await hooklane.publish(db, tenant="acme", type="order.created", data={"n": i})


async def _recorded(db, n: int):
    rows = await db.fetch("SELECT * FROM deliveries WHERE state IN ('pending', 'dead') AND attempts = 1")
    return rows if len(rows) >= n else None


def _as_kept(rows) -> list[tuple] | None:
    fields = ("id", "state", "attempts", "next_attempt_at", "last_error")
    return None if rows is None else sorted(tuple(r[f] for f in fields) for r in rows)


@pytest.mark.parametrize("mode", sorted(EXPECTED))
async def test_a_hostile_receiver_ends_as_a_recorded_failure(
    mode, db, hostile, receiver, settings, start_worker, figures
):
    n = DELIVERIES.get(mode, 3)
    # Every delivery in one round, and fewer than the 20 failures that
    # open the circuit, so that each is sent exactly once.
    await add_endpoint(db, mode, hostile.url(mode), timeout_seconds=TIMEOUT, max_concurrency=32)
    await _publish(db, n)
    worker = start_worker()
    await wait_for(lambda: hostile.hits[mode] >= 1)
    first_hit = time.monotonic()
    rows = await wait_for(lambda: _recorded(db, n), timeout=TIMEOUT + 10)
    took = time.monotonic() - first_hit
    # the deadline, plus the reservation poll and the recorder's round trip
    assert took < TIMEOUT + 2, f"{mode}: recorded {took:.2f} s after the first call"

    now = datetime.now(UTC)
    for row in rows:
        assert row["state"] == "pending"
        # backed off like any failure: the first retry is 15 to 30 s away,
        # further if a Retry-After asked for more, never more than 6 h
        wait = (row["next_attempt_at"] - now).total_seconds()
        assert 10 < wait <= 6 * 3600, (mode, wait)
        assert row["last_error"] in EXPECTED[mode], (mode, row["last_error"])
    endpoint = await db.fetchrow("SELECT * FROM endpoints")
    assert endpoint["consecutive_failures"] == n
    assert endpoint["last_error"] in EXPECTED[mode]

    # Not sent again once the lease would have run out (timeout + grace): a
    # result that was never recorded would be rescued and sent at once. The
    # proof that a rescue ran past that point: a healthy endpoint's delivery,
    # left in flight with a lease ending after theirs, rescued and delivered;
    # the worker still delivers, too.
    await add_endpoint(db, "healthy", receiver.on("healthy", Answer(204)), tenant="other")
    async with db.transaction():
        await hooklane.publish(db, tenant="other", type="order.created", data={})
        await db.execute(
            "UPDATE deliveries d SET state = 'sending', reserved_at = now(),"
            " lease_expires_at = now() + make_interval(secs => $1)"
            " FROM endpoints ep WHERE ep.id = d.endpoint_id AND ep.name = 'healthy'",
            TIMEOUT + settings.lease_grace_seconds,
        )
    await wait_for(lambda: receiver.at("healthy"), timeout=TIMEOUT + settings.lease_grace_seconds + 10)
    assert hostile.hits[mode] == n
    assert _as_kept(await _recorded(db, n)) == _as_kept(rows)
    assert not worker.task.done()
    figures.append(f"{mode}: {n} failures recorded {took:.2f} s after the first call")


async def test_garbage_retry_after_is_ignored_or_capped(db, hostile, start_worker):
    n = len(RETRY_AFTER_VALUES)
    await add_endpoint(
        db, "ra", hostile.url("garbage_retry_after"), timeout_seconds=TIMEOUT, max_concurrency=32
    )
    await _publish(db, n)
    start_worker()
    rows = await wait_for(lambda: _recorded(db, n))
    now = datetime.now(UTC)
    waits = sorted((r["next_attempt_at"] - now).total_seconds() for r in rows)
    # Among the values, "9" * 5000 and a date in 9999 ask for more than the
    # cap and get the cap; everything else is ignored and the backoff stands.
    capped = [w for w in waits if w > 30]
    assert len(capped) == 2 and all(6 * 3600 - 10 < w <= 6 * 3600 for w in capped), waits
    assert all(13 < w <= 30 for w in waits[: n - 2]), waits


async def test_the_last_allowed_failure_is_dead_with_a_clean_reason(db, hostile, start_worker):
    await add_endpoint(db, "noise", hostile.url("not_http"), timeout_seconds=TIMEOUT)
    await _publish(db, 1)
    start_worker(retry=RetryPolicy(max_attempts=1))
    row = await wait_for(lambda: db.fetchrow("SELECT * FROM deliveries WHERE state = 'dead'"))
    assert row["last_error"] == "invalid response; gave up after 1 attempts"
    assert await db.fetchval("SELECT consecutive_failures FROM endpoints") == 1


def _rss_after_collect() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss


async def test_a_huge_body_is_not_read_and_costs_no_memory(db, hostile, start_worker, figures):
    # The contract: a 2xx counts by its status alone, the body never read.
    n = 8
    await add_endpoint(db, "huge", hostile.url("huge_body"), timeout_seconds=TIMEOUT, max_concurrency=8)
    await _publish(db, n)
    before = _rss_after_collect()
    start_worker()
    await wait_for(lambda: hostile.hits["huge_body"] >= 1)
    first_hit = time.monotonic()
    await wait_for(lambda: db.fetchval("SELECT count(*) = $1 FROM deliveries WHERE state = 'delivered'", n))
    took = time.monotonic() - first_hit
    growth = _rss_after_collect() - before
    assert took < TIMEOUT
    assert growth < MEMORY_BOUND, f"RSS grew {growth / 2**20:.1f} MiB"
    # each answer offered 512 MiB; the worker hung up after the headers
    assert hostile.huge_body_sent < n * 16 * 2**20
    figures.append(
        f"huge_body: {n} delivered {took:.2f} s after the first call; RSS {growth / 2**20:+.1f} MiB;"
        f" {hostile.huge_body_sent / 2**20:.0f} MiB written of {n * 512} MiB offered"
    )


async def test_trickling_receivers_cost_no_memory(db, hostile, start_worker, figures):
    n = 32
    await add_endpoint(db, "trickle", hostile.url("trickle"), timeout_seconds=2, max_concurrency=16)
    await add_endpoint(db, "slow", hostile.url("slow_headers"), timeout_seconds=2, max_concurrency=16)
    await _publish(db, n // 2)
    before = _rss_after_collect()
    start_worker()
    await wait_for(lambda: _recorded(db, n), timeout=15)
    growth = _rss_after_collect() - before
    assert growth < MEMORY_BOUND, f"RSS grew {growth / 2**20:.1f} MiB"
    figures.append(f"trickle + slow_headers: {n} timeouts recorded; RSS {growth / 2**20:+.1f} MiB")


async def test_endless_headers_are_cut_short(db, hostile, start_worker):
    # aiohttp stops at 128 headers, long before the deadline: the receiver
    # cannot make the worker buffer headers for the whole call.
    await add_endpoint(db, "endless", hostile.url("endless_headers"), timeout_seconds=10)
    await _publish(db, 1)
    start_worker()
    await wait_for(lambda: hostile.hits["endless_headers"] >= 1)
    started = time.monotonic()
    rows = await wait_for(lambda: _recorded(db, 1))
    assert rows[0]["last_error"] == "invalid response"
    assert time.monotonic() - started < 2


# The mapping from what aiohttp and the OS raise to what a tenant reads: no
# receiver bytes, and refused, reset, closed and unresolvable alike (no port
# scanning through the delivery log).


def _key(host: str, port: int) -> ConnectionKey:
    return ConnectionKey(**{**dict.fromkeys(ConnectionKey._fields), "host": host, "port": port})


@pytest.mark.parametrize(
    "exc, expected",
    [
        (TimeoutError(), TIMED_OUT),
        (aiohttp.ConnectionTimeoutError("Connection timeout to host"), TIMED_OUT),
        (aiohttp.SocketTimeoutError("Timeout on reading data from socket"), TIMED_OUT),
        (
            aiohttp.ClientConnectorError(
                _key("10.0.0.1", 8443), ConnectionRefusedError(errno.ECONNREFUSED, "refused")
            ),
            "connection failed",
        ),
        (aiohttp.ClientOSError(errno.ECONNRESET, "Connection reset by peer"), "connection failed"),
        (aiohttp.ServerDisconnectedError(), "connection failed"),
        (aiohttp.ClientConnectionResetError("Cannot write to closing transport"), "connection failed"),
        (ConnectionRefusedError(errno.ECONNREFUSED, "refused"), "connection failed"),
        (OSError(errno.EHOSTUNREACH, "No route to host"), "connection failed"),
        (
            aiohttp.ClientConnectorDNSError(
                _key("nx.invalid", 443), OSError(-2, "Name or service not known")
            ),
            "connection failed",
        ),
        (ssl.SSLCertVerificationError(1, "certificate verify failed: self-signed certificate"), "TLS error"),
        (
            aiohttp.ClientConnectorCertificateError(
                _key("example.com", 443), ssl.SSLCertVerificationError(1, "bad")
            ),
            "TLS error",
        ),
        (
            aiohttp.ClientConnectorSSLError(_key("example.com", 443), ssl.SSLError(1, "wrong version")),
            "TLS error",
        ),
        (
            aiohttp.ClientResponseError(None, (), status=400, message="Bad status line 'HTTP/1.1 abc\x00'"),
            "invalid response",
        ),
        (aiohttp.ClientPayloadError("Response payload is not completed"), "invalid response"),
        (aiohttp.InvalidURL("http://[::1"), "invalid URL"),
        (aiohttp.NonHttpUrlClientError("ftp://example.com/"), "invalid URL"),
    ],
    ids=lambda v: type(v).__name__ if isinstance(v, BaseException) else "",
)
def test_failures_map_to_a_few_classes_without_detail(exc, expected):
    assert failure_class(exc, TIMEOUT)[1] == expected


async def test_a_refused_connection_is_recorded_as_connection_failed(db, start_worker):
    # a port that nothing listens on: bound, never listened
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
        await add_endpoint(db, "closed", f"http://127.0.0.1:{port}/", timeout_seconds=TIMEOUT)
        await _publish(db, 1)
        start_worker()
        rows = await wait_for(lambda: _recorded(db, 1))
    assert rows[0]["last_error"] == "connection failed"
    assert rows[0]["next_attempt_at"] > datetime.now(UTC) + timedelta(seconds=10)

"""The destination guard end to end: a real worker, real Postgres, and a
real listener on loopback that counts every TCP connection it accepts, so
that "refused" means no connection was ever opened, not merely that no
request arrived."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest

import hooklane
from hooklane import metrics
from hooklane.guard import DestinationNotAllowed, parse_networks
from hooklane.worker.sender import Sender, guarded_socket
from testsupport.fixtures import LOOPBACK, add_endpoint, wait_for, worker_process

ALLOWED = parse_networks(LOOPBACK)

# How a URL can name the listener, and what the worker records when nothing
# beyond global addresses is allowed. The check runs on the address about to
# be dialled, after DNS, so a name (localhost) and IPv6 forms carrying
# 127.0.0.1 are caught like the plain address.
REFUSED = {
    "127.0.0.1": "destination 127.0.0.1 is not allowed",
    "localhost": "destination 127.0.0.1 is not allowed",
    "[::1]": "destination ::1 is not allowed",
    "[::ffff:127.0.0.1]": "destination ::ffff:7f00:1 is not allowed",
    "[::127.0.0.1]": "destination ::7f00:1 is not allowed",
    "[64:ff9b::127.0.0.1]": "destination 64:ff9b::7f00:1 is not allowed",
    "[2002:7f00:1::1]": "destination 2002:7f00:1::1 is not allowed",
    "[fe80::1%25lo]": "destination fe80::1%25lo is not allowed",
    # Linux dials the unspecified address as loopback
    "0.0.0.0": "destination 0.0.0.0 is not allowed",
    "[::]": "destination :: is not allowed",
}
# Legacy numeric IPv4 forms, each 127.0.0.1 to libc. aiohttp 3.14 refuses the
# decimal and octal ones as a URL before any lookup and hands the hex ones to
# the resolver, which reads them as 127.0.0.1; older releases dialled the
# decimal ones as literals. Whichever way a release goes, the guard holds:
# either aiohttp refuses it, or the guard refuses what it became.
NUMERIC = ["127.1", "2130706433", "0177.0.0.1", "017700000001", "0", "0x7f000001", "0x7f.1"]
# With loopback allowed, these reach the listener.
DELIVERED = ["127.0.0.1", "localhost", "[::1]", "[::ffff:127.0.0.1]"]


class Listener:
    """HTTP/1.1 on 127.0.0.1 and ::1, one port: counts every connection it
    accepts and answers every request 204."""

    def __init__(self) -> None:
        self.accepted = 0
        self.requests = 0
        self.port = 0
        self._servers: list[asyncio.Server] = []

    def url(self, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}/hook"

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        try:
            head = await reader.readuntil(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n"):
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            await reader.readexactly(length)
            self.requests += 1
            writer.write(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> Listener:
        # The port is free on 127.0.0.1; it almost always is on ::1 too.
        for _ in range(20):
            v4 = await asyncio.start_server(self._serve, "127.0.0.1", 0)
            port = v4.sockets[0].getsockname()[1]
            try:
                v6 = await asyncio.start_server(self._serve, "::1", port)
            except OSError:
                v4.close()
                await v4.wait_closed()
                continue
            self._servers, self.port = [v4, v6], port
            return self
        raise RuntimeError("no port free on both 127.0.0.1 and ::1")

    async def __aexit__(self, *exc: object) -> None:
        for server in self._servers:
            server.close()
            await server.wait_closed()


@pytest.fixture
async def listener() -> AsyncIterator[Listener]:
    async with Listener() as server:
        yield server


async def _endpoints(db, listener: Listener, hosts: list[str]) -> None:
    # Inserted behind URL validation (which refuses some of these spellings
    # outright): the guard must hold whatever got into the table.
    for i, host in enumerate(hosts):
        await add_endpoint(db, f"e{i}", listener.url(host), timeout_seconds=2)
    await hooklane.publish(db, tenant="acme", type="probe", data={})


async def _outcomes(db, n: int) -> dict[str, tuple[str, str | None]] | None:
    rows = await db.fetch(
        """
        SELECT e.url, d.state, d.last_error FROM deliveries d JOIN endpoints e ON e.id = d.endpoint_id
        WHERE d.attempts >= 1 AND d.state <> 'sending'
        """
    )
    if len(rows) < n:
        return None
    return {r["url"].split("//")[1].rsplit(":", 1)[0]: (r["state"], r["last_error"]) for r in rows}


async def test_loopback_receives_nothing_unless_allowed_whatever_the_spelling(db, listener, start_worker):
    hosts = [*REFUSED, *NUMERIC]
    await _endpoints(db, listener, hosts)
    denied_before = metrics.DESTINATIONS_DENIED._value.get()
    start_worker(allowed_networks=())
    outcomes = await wait_for(lambda: _outcomes(db, len(hosts)))
    assert listener.accepted == 0
    assert {host: outcomes[host] for host in REFUSED} == {
        host: ("pending", error) for host, error in REFUSED.items()
    }
    for host in NUMERIC:
        refusals = {
            "invalid URL",
            "destination 127.0.0.1 is not allowed",
            f"destination {host} is not allowed",
        }
        assert outcomes[host][0] == "pending" and outcomes[host][1] in refusals, (host, outcomes[host])
    denied = sum(error.startswith("destination") for _, error in outcomes.values())
    assert denied >= len(REFUSED)
    assert metrics.DESTINATIONS_DENIED._value.get() - denied_before == denied


async def test_allow_listed_loopback_is_delivered_to_and_nothing_more(db, listener, start_worker):
    still_refused = {host: REFUSED[host] for host in ("0.0.0.0", "[::]", "[fe80::1%25lo]")}
    hosts = [*DELIVERED, *still_refused]
    await _endpoints(db, listener, hosts)
    start_worker()  # the settings fixture allows 127.0.0.0/8 and ::1/128
    outcomes = await wait_for(lambda: _outcomes(db, len(hosts)))
    assert outcomes == {
        **dict.fromkeys(DELIVERED, ("delivered", None)),
        **{host: ("pending", error) for host, error in still_refused.items()},
    }
    assert listener.requests == listener.accepted == len(DELIVERED)


@pytest.mark.processes
async def test_a_worker_process_reads_the_allow_list_from_its_environment(db, dsn, listener):
    await _endpoints(db, listener, ["127.0.0.1"])
    worker = worker_process(dsn, HOOKLANE_ALLOWED_NETWORKS="10.20.0.0/16")
    try:
        outcomes = await wait_for(lambda: _outcomes(db, 1), timeout=30)
    finally:
        worker.terminate()
        worker.wait(30)
    assert outcomes == {"127.0.0.1": ("pending", "destination 127.0.0.1 is not allowed")}
    assert listener.accepted == 0


async def test_no_proxy_is_taken_from_the_environment(monkeypatch):
    # A proxy would dial the receiver on Hooklane's behalf, out of the
    # guard's sight: the variables are set, and ignored.
    async with Listener() as proxy, Listener() as receiver:
        for variable in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
            monkeypatch.setenv(variable, proxy.url())
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        sender = Sender(ALLOWED)
        try:
            attempt = await sender.send(receiver.url(), b"k" * 24, "msg_proxy", b"{}", 5)
        finally:
            await sender.close()
    assert attempt.status == 204 and receiver.requests == 1
    assert proxy.accepted == 0
    assert sender._session.trust_env is False


@pytest.mark.unit
@pytest.mark.parametrize(
    "family, address",
    [
        (socket.AF_INET, ("127.0.0.1", 80)),
        (socket.AF_INET6, ("::1", 80, 0, 0)),
        (socket.AF_INET6, ("::ffff:127.0.0.1", 80, 0, 0)),
    ],
)
def test_the_socket_factory_makes_sockets_for_allowed_addresses_only(family, address):
    info = (family, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", address)
    with pytest.raises(DestinationNotAllowed):
        guarded_socket(info, ())
    with guarded_socket(info, ALLOWED) as sock:
        assert sock.family == family
    # a host string the socket layer would resolve again is never dialled
    with pytest.raises(DestinationNotAllowed):
        guarded_socket((socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.1", 80)), ALLOWED)


async def test_the_socket_factory_alone_keeps_a_denied_address_undialled(listener):
    # The second line of defence, without the connector's own check: what
    # holds if a release of aiohttp went around ``_resolve_host``.
    connector = aiohttp.TCPConnector(socket_factory=lambda info: guarded_socket(info, ()))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as failed:
            await session.post(listener.url("localhost"), data=b"{}")
    assert isinstance(failed.value.os_error, DestinationNotAllowed)
    assert listener.accepted == 0

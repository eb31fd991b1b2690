"""The destination guard end to end: a real worker, real Postgres, and a
real listener on loopback that counts every TCP connection it accepts, so
that "refused" means no connection was ever opened, not merely that no
request arrived."""

from __future__ import annotations

import aiohttp
import pytest

from hooklane import metrics
from hooklane.guard import DestinationNotAllowed
from hooklane.worker.sender import Sender, guarded_socket
from testsupport.destination_guard import ALLOWED, Listener, add_listener_endpoints, outcomes_by_host
from testsupport.fixtures import wait_for

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


async def test_loopback_receives_nothing_unless_allowed_whatever_the_spelling(db, listener, start_worker):
    hosts = [*REFUSED, *NUMERIC]
    await add_listener_endpoints(db, listener, hosts)
    denied_before = metrics.DESTINATIONS_DENIED._value.get()
    start_worker(allowed_networks=())
    outcomes = await wait_for(lambda: outcomes_by_host(db, len(hosts)))
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
    await add_listener_endpoints(db, listener, hosts)
    start_worker()  # the settings fixture allows 127.0.0.0/8 and ::1/128
    outcomes = await wait_for(lambda: outcomes_by_host(db, len(hosts)))
    assert outcomes == {
        **dict.fromkeys(DELIVERED, ("delivered", None)),
        **{host: ("pending", error) for host, error in still_refused.items()},
    }
    assert listener.requests == listener.accepted == len(DELIVERED)


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


async def test_the_socket_factory_alone_keeps_a_denied_address_undialled(listener):
    # The second line of defence, without the connector's own check: what
    # holds if a release of aiohttp went around ``_resolve_host``.
    connector = aiohttp.TCPConnector(socket_factory=lambda info: guarded_socket(info, ()))
    async with aiohttp.ClientSession(connector=connector) as session:
        with pytest.raises(aiohttp.ClientConnectorError) as failed:
            await session.post(listener.url("localhost"), data=b"{}")
    assert isinstance(failed.value.os_error, DestinationNotAllowed)
    assert listener.accepted == 0

"""The destination guard's table, row by row, and its parsing: pure
functions, no network. The notations a URL can use reach the guard through
the real sender in tests/db/test_destination_guard.py."""

from __future__ import annotations

from ipaddress import IPv4Address, ip_address, ip_network

import pytest

from hooklane.errors import InvalidInput
from hooklane.guard import (
    DENIED_NETWORKS,
    DestinationNotAllowed,
    dialled_address,
    embedded_ipv4,
    ip_literal,
    is_allowed,
    literal_never_allowed,
    parse_networks,
)

LOOPBACK = parse_networks("127.0.0.0/8,::1/128")

# Every range the guard refuses, by its edges and the addresses that matter.
DENIED = {
    "this network, unspecified": ["0.0.0.0", "0.0.0.1", "0.255.255.255"],
    "private 10/8": ["10.0.0.0", "10.0.0.1", "10.255.255.255"],
    "carrier-grade NAT": ["100.64.0.0", "100.100.100.200", "100.127.255.255"],
    "loopback": ["127.0.0.1", "127.0.53.53", "127.255.255.255"],
    "link-local, cloud metadata": ["169.254.0.1", "169.254.169.254", "169.254.170.2", "169.254.255.255"],
    "private 172.16/12": ["172.16.0.0", "172.20.0.1", "172.31.255.255"],
    "IETF protocol assignments": ["192.0.0.0", "192.0.0.8", "192.0.0.170", "192.0.0.255"],
    "TEST-NET-1": ["192.0.2.0", "192.0.2.255"],
    "6to4 relay anycast": ["192.88.99.1"],
    "private 192.168/16": ["192.168.0.1", "192.168.255.255"],
    "benchmarking": ["198.18.0.0", "198.19.255.255"],
    "TEST-NET-2": ["198.51.100.7"],
    "TEST-NET-3": ["203.0.113.255"],
    "multicast": ["224.0.0.1", "239.255.255.250"],
    "reserved": ["240.0.0.1", "254.255.255.255"],
    "broadcast": ["255.255.255.255"],
    "IPv6 unspecified": ["::"],
    "IPv6 loopback": ["::1"],
    "local-use NAT64": ["64:ff9b:1::8.8.8.8", "64:ff9b:1:ffff::1"],
    "IPv6 benchmarking": ["2001:2::1", "2001:2:0:ffff::1"],
    "ORCHID": ["2001:10::1", "2001:1f:ffff::1"],
    "ORCHIDv2": ["2001:20::1", "2001:2f:ffff::1"],
    "IPv6 documentation": ["2001:db8::1", "2001:db8:ffff::1", "3fff::1", "3fff:fff::1"],
    "unique local, AWS IPv6 metadata": ["fc00::1", "fd00::1", "fd00:ec2::254", "fdff:ffff::1"],
    "IPv6 link-local": ["fe80::1", "fe80::1%eth0", "febf:ffff::1"],
    "site-local": ["fec0::1", "feff::1"],
    "IPv6 multicast": ["ff02::1", "ff05::1:3", "ff0e::1"],
    # not global unicast (2000::/3): discard-only, SRv6 SIDs, IETF reserved
    "IPv6 reserved": ["100::1", "5f00::1", "4000::1", "e000::1", "fe00::1", "0:0:1::1", "::ffff:0:7f00:1"],
    # the IPv6 forms that carry a denied IPv4 address
    "IPv4-mapped": ["::ffff:127.0.0.1", "::ffff:169.254.169.254", "::ffff:10.0.0.1", "::ffff:0.0.0.0"],
    "IPv4-compatible": ["::127.0.0.1", "::169.254.169.254", "::192.168.0.1", "::0.0.0.2"],
    "NAT64": ["64:ff9b::127.0.0.1", "64:ff9b::a9fe:a9fe", "64:ff9b::10.1.2.3"],
    "6to4": ["2002:7f00:1::", "2002:a9fe:a9fe::1", "2002:a00:1:ffff::1", "2002:c0a8:101::"],
    # client 127.0.0.1, 169.254.169.254, 10.0.0.1, bit-inverted
    "Teredo": ["2001:0:4136:e378:8000:63bf:80ff:fffe", "2001::5601:5601", "2001::f5ff:fffe"],
}

# Globally routable, including right next to the denied ranges, and IPv6
# forms carrying a global IPv4 address.
ALLOWED = [
    "1.1.1.1",
    "8.8.8.8",
    "9.255.255.255",
    "11.0.0.0",
    "100.63.255.255",
    "100.128.0.0",
    "126.255.255.255",
    "128.0.0.0",
    "169.253.255.255",
    "169.255.0.0",
    "172.15.255.255",
    "172.32.0.0",
    "192.0.1.255",
    "192.0.3.0",
    "192.167.255.255",
    "192.169.0.0",
    "198.17.255.255",
    "198.20.0.0",
    "223.255.255.255",
    "2606:4700:4700::1111",
    "2001:4860:4860::8888",
    "2a00:1450:4001:80b::200e",
    "2001:1::1",  # PCP anycast: in 2001::/23 but globally reachable
    "2001:db7:ffff::1",
    "2001:db9::1",
    "3fff:1000::1",
    "::ffff:8.8.8.8",
    "::8.8.8.8",
    "64:ff9b::8.8.8.8",
    "2002:808:808::1",
    "2001:0:4136:e378:8000:63bf:f7f7:f7f7",  # Teredo, client 8.8.8.8
]


@pytest.mark.parametrize(
    "what, address", [(what, a) for what, addresses in DENIED.items() for a in addresses]
)
def test_every_range_that_is_not_globally_routable_is_denied(what, address):
    assert not is_allowed(ip_address(address), ())


@pytest.mark.parametrize("address", ALLOWED)
def test_globally_routable_addresses_are_allowed(address):
    assert is_allowed(ip_address(address), ())


@pytest.mark.parametrize("network", DENIED_NETWORKS, ids=str)
def test_every_row_of_the_table_is_tested(network):
    cases = [ip_address(a) for addresses in DENIED.values() for a in addresses]
    assert any(address in network for address in cases)


@pytest.mark.parametrize(
    "address, embedded",
    [
        ("::ffff:127.0.0.1", "127.0.0.1"),
        ("::ffff:808:808", "8.8.8.8"),
        ("::10.0.0.1", "10.0.0.1"),
        ("64:ff9b::169.254.169.254", "169.254.169.254"),
        ("2002:7f00:1::", "127.0.0.1"),
        ("2002:c000:22d:1234:5678::1", "192.0.2.45"),
        # RFC 4380's example: server 65.54.227.120, client 192.0.2.45
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", "192.0.2.45"),
        ("2001::ffff:ffff", "0.0.0.0"),
        ("2606:4700:4700::1111", None),
        ("64:ff9b:1::7f00:1", None),
        ("fe80::7f00:1", None),
        ("127.0.0.1", None),
    ],
)
def test_embedded_ipv4(address, embedded):
    assert embedded_ipv4(ip_address(address)) == (embedded and IPv4Address(embedded))


def test_the_allow_list_comes_first_and_covers_what_it_names_only():
    allowed = parse_networks("127.0.0.0/8,::1/128,10.20.0.0/16")
    for address in ["127.0.0.1", "127.8.9.10", "::1", "10.20.0.1", "10.20.255.255", "8.8.8.8"]:
        assert is_allowed(ip_address(address), allowed), address
    for address in [
        "10.21.0.1",
        "10.19.255.255",
        "169.254.169.254",
        "0.0.0.0",
        "::",
        "fe80::1",
        "192.168.0.1",
    ]:
        assert not is_allowed(ip_address(address), allowed), address


def test_an_embedded_address_is_judged_with_the_allow_list_too():
    # ::ffff:127.0.0.1 dialled is 127.0.0.1: allowed exactly when it is
    assert is_allowed(ip_address("::ffff:127.0.0.1"), LOOPBACK)
    assert is_allowed(ip_address("2002:7f00:1::"), LOOPBACK)
    assert not is_allowed(ip_address("::ffff:127.0.0.1"), parse_networks("::1/128"))
    # an IPv4 network never covers an IPv6 address, nor the reverse
    assert not is_allowed(ip_address("::1"), parse_networks("127.0.0.0/8"))
    assert not is_allowed(ip_address("127.0.0.1"), parse_networks("::/0"))


@pytest.mark.parametrize(
    "host, address",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("::ffff:7f00:1", "::ffff:7f00:1"),
        ("fe80::1%eth0", "fe80::1%eth0"),
        ("fe80::1%25eth0", "fe80::1%25eth0"),
    ],
)
def test_dialled_address_reads_what_a_resolver_or_a_literal_gives(host, address):
    assert dialled_address(host) == ip_address(address)


@pytest.mark.parametrize("host", ["127.1", "2130706433", "0x7f.1", "localhost", "::ffff:127.1", ""])
def test_a_dialled_host_that_is_not_an_address_is_refused(host):
    # the socket layer would resolve it once more, out of the guard's sight
    with pytest.raises(DestinationNotAllowed):
        dialled_address(host)


@pytest.mark.parametrize(
    "host, address",
    [
        ("127.0.0.1", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0x7F.1", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("017700000001", "127.0.0.1"),
        ("0", "0.0.0.0"),
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("10.1", "10.0.0.1"),
        ("[::1]", "::1"),
        ("[0:0:0:0:0:0:0:1]", "::1"),
        ("[::]", "::"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[::ffff:7f00:1]", "::ffff:7f00:1"),
        ("[64:ff9b::127.0.0.1]", "64:ff9b::7f00:1"),
        ("[fe80::1%25eth0]", "fe80::1"),
        ("fe80::1%eth0", "fe80::1"),
        ("[FD00:EC2::254]", "fd00:ec2::254"),
    ],
)
def test_ip_literals_in_every_notation_are_refused_by_their_address(host, address):
    assert ip_literal(host) == ip_address(address)
    assert literal_never_allowed(host, ()) == f"destination {address} is not allowed"


@pytest.mark.parametrize(
    "host", ["localhost", "example.com", "deadbeef", "cafe.babe", "127.0.0.1.", "[::ffff:127.1]"]
)
def test_names_are_left_to_the_check_at_connect_time(host):
    assert ip_literal(host) is None
    assert literal_never_allowed(host, ()) is None


@pytest.mark.parametrize("host", ["8.8.8.8", "134744072", "[2606:4700:4700::1111]", "[::ffff:8.8.8.8]"])
def test_global_literals_may_be_delivered_to(host):
    assert literal_never_allowed(host, ()) is None


def test_an_allow_listed_literal_may_be_delivered_to():
    assert literal_never_allowed("127.0.0.1", LOOPBACK) is None
    assert literal_never_allowed("[::1]", LOOPBACK) is None
    assert literal_never_allowed("10.0.0.1", LOOPBACK) == "destination 10.0.0.1 is not allowed"


def test_the_refusal_is_an_oserror_naming_the_address():
    refusal = DestinationNotAllowed("10.0.0.1")
    assert isinstance(refusal, OSError) and refusal.address == "10.0.0.1"
    assert str(refusal) == "destination 10.0.0.1 is not allowed"
    # a zone id is the only free text an address can hold
    assert str(DestinationNotAllowed("fe80::1%a\nb")) == "destination fe80::1%a\\nb is not allowed"


def test_the_allow_list_is_read_from_comma_separated_cidrs():
    assert parse_networks("127.0.0.0/8, ::1/128,10.20.0.0/16,") == (
        ip_network("127.0.0.0/8"),
        ip_network("::1/128"),
        ip_network("10.20.0.0/16"),
    )
    assert parse_networks("") == () and parse_networks(" , ") == ()
    assert parse_networks("192.0.2.7") == (ip_network("192.0.2.7/32"),)


@pytest.mark.parametrize(
    "text, message",
    [
        ("10.0.0.1/8", "'10.0.0.1/8' has host bits set: the network is 10.0.0.0/8"),
        ("localhost", "'localhost' is not a network like 10.20.0.0/16 or ::1/128"),
        ("127.0.0.0/8;::1/128", "'127.0.0.0/8;::1/128' is not a network like 10.20.0.0/16 or ::1/128"),
        ("10.0.0.0/33", "'10.0.0.0/33' is not a network like 10.20.0.0/16 or ::1/128"),
        ("127.0.0.0/8,127.1/8", "'127.1/8' is not a network like 10.20.0.0/16 or ::1/128"),
        ("fe80::%eth0/64", "'fe80::%eth0/64': a zone id means nothing in a network"),
    ],
)
def test_a_bad_network_is_refused_naming_the_variable(text, message):
    with pytest.raises(InvalidInput) as refused:
        parse_networks(text)
    assert (refused.value.field, refused.value.message) == ("HOOKLANE_ALLOWED_NETWORKS", message)

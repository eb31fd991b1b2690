"""Which addresses Hooklane may open a connection to.

Whoever can write an endpoint's URL chooses where the worker connects from
inside the cluster. Left unchecked that reaches loopback, the cloud metadata
service, the database and every private network the worker can route to.
So an address is refused unless it is globally routable, or an operator
allowed its network explicitly (``HOOKLANE_ALLOWED_NETWORKS``).

Pure functions, no I/O: the sender applies them to the addresses it is about
to dial (after DNS), and manifest validation to IP literals in URLs.

Python 3.11's ``ipaddress.is_global`` is not used: it judges 6to4 and NAT64
addresses by their prefix, not by the IPv4 address they carry (so
2002:7f00:1:: and 64:ff9b::7f00:1, both loopback, are "global"), and its
tables changed between patch releases. The table below is ours and tested
row by row (tests/unit/test_guard.py).
"""

from __future__ import annotations

import re
import socket
from collections.abc import Sequence
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network

from hooklane.errors import InvalidInput, printable, shown

Address = IPv4Address | IPv6Address
Network = IPv4Network | IPv6Network

ALLOWED_NETWORKS_VARIABLE = "HOOKLANE_ALLOWED_NETWORKS"

# Every network no delivery may reach unless allow-listed. Prefixes that
# carry an IPv4 address (see embedded_ipv4) are deliberately absent: those
# addresses are judged by the IPv4 address they carry.
DENIED_NETWORKS: tuple[Network, ...] = tuple(
    ip_network(cidr)
    for cidr in (
        # IPv4: the IANA IPv4 Special-Purpose Address Registry (RFC 6890)
        # minus the rows it marks globally reachable.
        "0.0.0.0/8",  # "this network", incl. unspecified 0.0.0.0, which Linux dials as loopback: RFC 1122 3.2.1.3
        "10.0.0.0/8",  # private: RFC 1918
        "100.64.0.0/10",  # shared address space, carrier-grade NAT: RFC 6598
        "127.0.0.0/8",  # loopback: RFC 1122 3.2.1.3
        "169.254.0.0/16",  # link-local, incl. the cloud metadata service 169.254.169.254: RFC 3927
        "172.16.0.0/12",  # private: RFC 1918
        "192.0.0.0/24",  # IETF protocol assignments (DS-Lite, NAT64 discovery, two global anycasts too): RFC 6890
        "192.0.2.0/24",  # documentation, TEST-NET-1: RFC 5737
        "192.88.99.0/24",  # 6to4 relay anycast, deprecated: RFC 7526
        "192.168.0.0/16",  # private: RFC 1918
        "198.18.0.0/15",  # benchmarking: RFC 2544
        "198.51.100.0/24",  # documentation, TEST-NET-2: RFC 5737
        "203.0.113.0/24",  # documentation, TEST-NET-3: RFC 5737
        "224.0.0.0/4",  # multicast: RFC 5771
        "240.0.0.0/4",  # reserved, incl. limited broadcast 255.255.255.255: RFC 1112 4, RFC 919
        # IPv6: the IANA IPv6 Special-Purpose Address Registry (RFC 6890) and
        # the IANA IPv6 Address Space.
        "::/128",  # unspecified, which Linux dials as loopback: RFC 4291 2.5.2
        "::1/128",  # loopback: RFC 4291 2.5.3
        "64:ff9b:1::/48",  # local-use IPv4/IPv6 translation: RFC 8215
        "2001:2::/48",  # benchmarking: RFC 5180
        "2001:10::/28",  # ORCHID, deprecated: RFC 4843
        "2001:20::/28",  # ORCHIDv2, identifiers rather than locators: RFC 7343
        "2001:db8::/32",  # documentation: RFC 3849
        "3fff::/20",  # documentation: RFC 9637
        "fc00::/7",  # unique local, incl. the cloud metadata service fd00:ec2::254: RFC 4193
        "fe80::/10",  # link-local: RFC 4291 2.5.6
        "fec0::/10",  # site-local, deprecated: RFC 3879
        "ff00::/8",  # multicast: RFC 4291 2.7
    )
)

# Looked up by version: an address is only ever in networks of its own.
_DENIED_BY_VERSION = {v: tuple(n for n in DENIED_NETWORKS if n.version == v) for v in (4, 6)}

# IANA has allocated only 2000::/3 as global unicast (RFC 4291 2.4); the rest
# of the IPv6 space is special-purpose or reserved (the unnamed parts of
# ::/8, 100::/64 discard-only, 5f00::/16 SRv6 SIDs, and so on). Outside it
# only the prefixes that carry an IPv4 address may be dialled, judged by it.
_GLOBAL_UNICAST = IPv6Network("2000::/3")

# Prefixes that carry an IPv4 address: dialling one reaches (or is routed
# towards) the IPv4 address inside.
_MAPPED = IPv6Network("::ffff:0:0/96")  # IPv4-mapped: RFC 4291 2.5.5.2
_COMPATIBLE = IPv6Network("::/96")  # IPv4-compatible, deprecated: RFC 4291 2.5.5.1
_NAT64 = IPv6Network("64:ff9b::/96")  # NAT64 well-known prefix: RFC 6052 2.1
_SIX_TO_FOUR = IPv6Network("2002::/16")  # 6to4, the IPv4 address in bits 16-47: RFC 3056 2
_TEREDO = IPv6Network(
    "2001::/32"
)  # Teredo, the client's IPv4 address bit-inverted in bits 96-127: RFC 4380 4

_LOW_32 = 0xFFFFFFFF
# What the C library's inet_aton may read as an IPv4 address: 127.1,
# 2130706433, 0x7f.1, 0177.0.0.1. Anything else is a name for DNS.
_NUMERIC_HOST = re.compile(r"[0-9a-fA-FxX.]+")


_REFUSED = "is not allowed"


class DestinationNotAllowed(OSError):
    """A connection refused before it was opened: ``address`` (as it was to
    be dialled) is not allowed. An OSError, so that the HTTP client treats it
    as a connection that failed."""

    def __init__(self, address: str) -> None:
        super().__init__(f"destination {printable(address)} {_REFUSED}")
        self.address = address


def is_refusal(error: str | None) -> bool:
    """Whether a recorded delivery error is the guard's refusal, for the
    operator's condition on the endpoint."""
    return error is not None and error.startswith("destination ") and error.endswith(_REFUSED)


def embedded_ipv4(address: Address) -> IPv4Address | None:
    """The IPv4 address an IPv6 address carries (IPv4-mapped, IPv4-compatible,
    NAT64, 6to4, Teredo's client), or None."""
    if not isinstance(address, IPv6Address):
        return None
    value = int(address)
    if address in _MAPPED or address in _COMPATIBLE or address in _NAT64:
        return IPv4Address(value & _LOW_32)
    if address in _SIX_TO_FOUR:
        return IPv4Address((value >> 80) & _LOW_32)
    if address in _TEREDO:
        return IPv4Address(~value & _LOW_32)
    return None


def is_allowed(address: Address, allowed_networks: Sequence[Network]) -> bool:
    """Whether a connection to ``address`` may be opened: allow-listed, or
    neither in the denied table nor carrying a denied IPv4 address nor
    outside IPv6 global unicast. A zone id (fe80::1%eth0) does not matter."""
    if any(address in network for network in allowed_networks):
        return True
    if any(address in network for network in _DENIED_BY_VERSION[address.version]):
        return False
    inner = embedded_ipv4(address)
    if inner is not None:
        return is_allowed(inner, allowed_networks)
    return isinstance(address, IPv4Address) or address in _GLOBAL_UNICAST


def dialled_address(host: str) -> Address:
    """The address in a host string that is about to be dialled, as a
    resolver or an IP literal gave it (``fe80::1%eth0`` included). Anything
    else raises DestinationNotAllowed: a string that is not an address would
    be resolved again by the socket layer, behind the guard's back."""
    try:
        return ip_address(host)
    except ValueError:
        raise DestinationNotAllowed(host) from None


def ip_literal(host: str) -> Address | None:
    """The address an URL host names without any DNS lookup, read as the C
    library reads it (127.1, 2130706433, 0x7f.1 and 0177.0.0.1 are all
    127.0.0.1), or None for a name. Brackets and an IPv6 zone id are
    dropped; an IPv6 literal that does not parse is None too."""
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if ":" in host:
        try:
            return IPv6Address(host.split("%", 1)[0])
        except ValueError:
            return None
    if not _NUMERIC_HOST.fullmatch(host):
        return None
    try:
        return IPv4Address(socket.inet_aton(host))
    except OSError:
        return None


def literal_never_allowed(host: str, allowed_networks: Sequence[Network]) -> str | None:
    """Why a URL whose host is an IP literal can never be delivered to (the
    same words a delivery attempt would record), or None when the host is a
    name (judged when it is resolved, at each connection) or an allowed
    address."""
    address = ip_literal(host)
    if address is None or is_allowed(address, allowed_networks):
        return None
    return str(DestinationNotAllowed(str(address)))


def parse_networks(text: str) -> tuple[Network, ...]:
    """``HOOKLANE_ALLOWED_NETWORKS``: comma-separated CIDRs such as
    ``127.0.0.0/8,::1/128,10.20.0.0/16``; a bare address is its own /32 or
    /128. Blank entries are skipped; anything else that is not a network is
    refused, so that a typo never widens or silently narrows the list."""
    networks: list[Network] = []
    for entry in (part.strip() for part in text.split(",")):
        if not entry:
            continue
        if "%" in entry:
            raise InvalidInput(
                ALLOWED_NETWORKS_VARIABLE, f"{shown(entry)}: a zone id means nothing in a network"
            )
        try:
            networks.append(ip_network(entry))
            continue
        except ValueError:
            pass
        try:
            loose = ip_network(entry, strict=False)
        except ValueError:
            raise InvalidInput(
                ALLOWED_NETWORKS_VARIABLE, f"{shown(entry)} is not a network like 10.20.0.0/16 or ::1/128"
            ) from None
        raise InvalidInput(
            ALLOWED_NETWORKS_VARIABLE, f"{shown(entry)} has host bits set: the network is {loose}"
        )
    return tuple(networks)

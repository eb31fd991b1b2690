"""The destination guard's socket factory makes sockets for allowed
addresses only."""

from __future__ import annotations

import socket

import pytest

from hooklane.guard import DestinationNotAllowed
from hooklane.worker.sender import guarded_socket
from testsupport.destination_guard import ALLOWED


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

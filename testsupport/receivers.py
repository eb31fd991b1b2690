"""Real HTTP receivers on loopback that record what they get."""

from __future__ import annotations

import asyncio
import contextlib
import re
import socket
import ssl
import struct
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

from aiohttp import web


@dataclass(frozen=True)
class Answer:
    """How a receiver path answers: after ``delay`` seconds, ``status`` with
    ``headers`` and a body of ``body_bytes``; ``hang`` never answers, and
    ``held`` not before the test sets it."""

    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body_bytes: int = 0
    hang: bool = False
    held: asyncio.Event | None = None


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


Behaviour = Answer | Callable[[int], Answer]

# The headers of an ordered delivery (docs/receivers.md): its key, and its
# number among the key's deliveries to the endpoint. The receiver counts
# each key's calls in flight, and may answer a key apart.
ORDERING_KEY = "hooklane-ordering-key"
ORDERING_SEQUENCE = "hooklane-ordering-sequence"


class Receiver:
    """``ssl_context``: listen for HTTPS with it instead of HTTP."""

    def __init__(self, host: str = "127.0.0.1", ssl_context: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.ssl_context = ssl_context
        self.received: list[Received] = []
        self.behaviours: dict[str, Behaviour] = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        # The same per path and ordering key, for ordered deliveries.
        self.key_in_flight: dict[tuple[str, str], int] = defaultdict(int)
        self.key_peak: dict[tuple[str, str], int] = defaultdict(int)
        self.key_behaviours: dict[tuple[str, str], Behaviour] = {}
        self._counts: dict[str, int] = defaultdict(int)
        self._key_counts: dict[tuple[str, str], int] = defaultdict(int)
        self.arrived = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Handlers that hang on purpose must not hold up teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self.port = 0

    def url(self, path: str) -> str:
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://{self.host}:{self.port}/{path.lstrip('/')}"

    def on(self, path: str, behaviour: Behaviour) -> str:
        self.behaviours["/" + path.lstrip("/")] = behaviour
        return self.url(path)

    def on_key(self, path: str, key: str, behaviour: Behaviour) -> None:
        """Answer the ordered deliveries of ``key`` at ``path`` so (its
        index counts that key's requests), the others as the path does."""
        self.key_behaviours[("/" + path.lstrip("/"), key)] = behaviour

    def at(self, path: str) -> list[Received]:
        path = "/" + path.lstrip("/")
        return [r for r in self.received if r.path == path]

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        path = request.path
        body = await request.read()
        self.received.append(Received(path, dict(request.headers), body, time.time()))
        self.arrived.set()
        index = self._counts[path]
        self._counts[path] += 1
        behaviour = self.behaviours.get(path, Answer())
        keyed = (path, request.headers.get(ORDERING_KEY, ""))
        if keyed in self.key_behaviours:
            index = self._key_counts[keyed]
            self._key_counts[keyed] += 1
            behaviour = self.key_behaviours[keyed]
        answer = behaviour(index) if callable(behaviour) else behaviour
        self.in_flight[path] += 1
        self.peak[path] = max(self.peak[path], self.in_flight[path])
        self.key_in_flight[keyed] += 1
        self.key_peak[keyed] = max(self.key_peak[keyed], self.key_in_flight[keyed])
        try:
            if answer.hang:
                await asyncio.sleep(3600)
            if answer.held is not None:
                await answer.held.wait()
            if answer.delay:
                await asyncio.sleep(answer.delay)
            if answer.body_bytes:
                response = web.StreamResponse(status=answer.status, headers=answer.headers)
                response.content_length = answer.body_bytes
                await response.prepare(request)
                chunk = b"x" * 65536
                sent = 0
                while sent < answer.body_bytes:
                    await response.write(chunk[: answer.body_bytes - sent])
                    sent += len(chunk)
                return response
            return web.Response(status=answer.status, headers=answer.headers)
        finally:
            self.in_flight[path] -= 1
            self.key_in_flight[keyed] -= 1

    async def __aenter__(self) -> Receiver:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0, ssl_context=self.ssl_context)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()


def _reset(conn: socket.socket) -> None:
    """Closes abortively (SO_LINGER 0: a reset, not a FIN), as a server or
    load balancer that drops a refused client does: the alert already sent
    is all the client gets before the reset."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _linger(conn: socket.socket) -> None:
    """Reads what the client still sends before closing, as nginx's lingering
    close does: with TLS 1.3 a refused client has finished its handshake and
    is sending its request, and closing on that unread data answers it with a
    reset that can overtake the alert already sent."""
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(2)
        while conn.recv(65536):
            pass


class OpenSslReceiver:
    """An HTTPS receiver on blocking sockets, a thread per connection, that
    answers 204 to each request and records its head. asyncio's SSL
    transport (so the aiohttp Receiver) closes a failed handshake without
    sending OpenSSL's fatal alert (CPython gh-98078), and its client sees a
    bare reset; a blocking socket sends it, as nginx or a load balancer
    does: how a refused client certificate reaches a sender. It closes a
    refused handshake politely (lingering), or with a reset when ``reset``."""

    def __init__(self, context: ssl.SSLContext, *, reset: bool = False) -> None:
        self._context = context
        self._close_refused = _reset if reset else _linger
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port = self._listener.getsockname()[1]
        self.heads: list[bytes] = []
        # The handshakes it refused, by OpenSSL's reason.
        self.refused: list[str] = []

    def url(self, path: str) -> str:
        return f"https://127.0.0.1:{self.port}/{path.lstrip('/')}"

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        conn.settimeout(10)
        # The handshake is ours to call: wrap_socket closes the socket when
        # its own handshake fails, before a lingering close could run.
        with self._context.wrap_socket(conn, server_side=True, do_handshake_on_connect=False) as tls:
            try:
                tls.do_handshake()
            except ssl.SSLError as exc:
                self.refused.append(exc.reason or str(exc))
                with socket.socket(fileno=tls.detach()) as raw:
                    self._close_refused(raw)
                return
            data = b""
            while b"\r\n\r\n" not in data and (chunk := tls.recv(65536)):
                data += chunk
            head, _, body = data.partition(b"\r\n\r\n")
            length = re.search(rb"(?im)^content-length:\s*(\d+)", head)
            while length and len(body) < int(length[1]) and (chunk := tls.recv(65536)):
                body += chunk
            self.heads.append(head)
            tls.sendall(b"HTTP/1.1 204 No Content\r\nConnection: close\r\n\r\n")

    def __enter__(self) -> OpenSslReceiver:
        threading.Thread(target=self._accept, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        # Wakes the blocked accept (close alone does not, on Linux).
        self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()


def numbers_by_key(received: Iterable[Received]) -> dict[str, list[int]]:
    """The sequence numbers a receiver got of each key, in the order it got
    them (its ordered requests only)."""
    numbers: dict[str, list[int]] = {}
    for r in received:
        key = r.headers.get(ORDERING_KEY)
        if key is not None:
            numbers.setdefault(key, []).append(int(r.headers[ORDERING_SEQUENCE]))
    return numbers


def order_broken(received: Mapping[str, Sequence[int]]) -> list[str]:
    """Where the numbers a receiver got of a key, in the order it got them,
    break the guarantee: a number lower than the one before it. (A repeat
    is only ever of the latest, at least once: the numbers never go down.)"""
    return [
        f"{key}: {after} after {before} in {list(seqs)}"
        for key, seqs in received.items()
        for before, after in pairwise(seqs)
        if after < before
    ]

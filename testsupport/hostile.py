"""A receiver that misbehaves on purpose, at the byte level.

A raw asyncio TCP server on loopback: aiohttp's own server would sanitise
what it writes. The first segment of the request path picks the misbehaviour
(``HostileServer.url(mode)``). Modes that answer with a variety of bad
values cycle through them, one per request received in that mode.
"""

from __future__ import annotations

import asyncio
import collections
import random
import socket
import struct

_HUGE_BODY_BYTES = 512 * 1024 * 1024
_CHUNK = 64 * 1024

RETRY_AFTER_VALUES: tuple[bytes, ...] = (
    "٣".encode(),  # Arabic-Indic three: str.isdigit says yes, float says no
    "²".encode(),
    "٣٠".encode(),
    b"9" * 5000,
    b"-1",
    b"1e9",
    b"1.5",
    b"inf",
    b"nan",
    b"0x10",
    b"+30",
    b"\x80\xfe\xff\xc3",  # not UTF-8: aiohttp makes lone surrogates of it
    b"Sun, 06 Nov 99999 08:49:37 GMT",
    b"Sun, 06 Nov 0000 08:49:37 GMT",
    b"Fri, 31 Dec 9999 23:59:59 GMT",
    b"Sun, 06 Nov 1994 08:49:37 GMT",
    b"Sun, 06 Nov 2024 08:49:37 +9999",
    b"Sun, 06 Nov 2024 08:49:37 +" + b"9" * 40,
    b"Mon, 99 Foo 2024 99:99:99 GMT",
)

# Each a whole answer, headers and all. Whether aiohttp rejects a given one
# or passes it through decoded oddly, the worker must record a failure.
GARBAGE_HEADER_ANSWERS: tuple[bytes, ...] = (
    b"HTTP/1.1 503 Service Unavailable\r\nX-Bytes: \x80\xfe\xff\xc3(\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: \xd9\xa3\xff\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nX-Folded: one\r\n two\r\n\tthree\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\n 2\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nX-Long: " + b"a" * 100_000 + b"\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nX-Ctl: a\x01\x1b[31mred\x7f\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nno colon here\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\n: empty name\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nContent-Length: 7\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: -1\r\n",
    b"HTTP/1.1 503 Service Unavailable\r\nTransfer-Encoding: chunked, gzip\r\n",
)

GARBAGE_STATUS_LINES: tuple[bytes, ...] = (
    b"HTTP/1.1 999 X",
    b"HTTP/1.1 abc",
    b"HTTP/1.1 000 Zero",
    b"HTTP/1.1 099 Low",
    b"HTTP/1.1 600 Beyond",
    b"HTTP/1.1 -20 Negative",
    b"HTTP/1.1 2000 OK",
    b"HTTP/1.1 20 OK",
    b"HTTP/1.1 2\xd9\xa3\xd9\xa3 OK",
    b"HTTP/9.9 503 Future",
    b"HTTP/1.1 503 \x00\x01\xff",
    b"FTP/1.1 503 Nope",
    b"HTTP/1.1",
)


class HostileServer:
    """``async with HostileServer() as server``: ``server.url(mode)`` for an
    endpoint, ``server.hits[mode]`` for the requests received in each mode."""

    MODES: tuple[str, ...] = (
        "hang",
        "trickle",
        "slow_headers",
        "endless_headers",
        "close_after_headers",
        "reset",
        "huge_body",
        "garbage_retry_after",
        "garbage_headers",
        "garbage_status",
        "http09",
        "not_http",
    )

    def __init__(self, *, huge_body_bytes: int = _HUGE_BODY_BYTES, seed: int = 0) -> None:
        self.hits: collections.Counter[str] = collections.Counter()
        # Bytes of huge bodies written in all, to show that clients hung up
        # long before the end.
        self.huge_body_sent = 0
        self.port = 0
        self._huge_body_bytes = huge_body_bytes
        self._random = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task] = set()

    def url(self, mode: str) -> str:
        if mode not in self.MODES:
            raise ValueError(f"unknown mode {mode!r}")
        return f"http://127.0.0.1:{self.port}/{mode}"

    async def __aenter__(self) -> HostileServer:
        self._server = await asyncio.start_server(self._connection, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        # Connections in "hang" or "trickle" never end by themselves.
        for task in self._connections:
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)
        await self._server.wait_closed()

    async def _connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        self._connections.add(task)
        try:
            mode = await _read_request(reader)
            if mode is None:
                return
            index = self.hits[mode]
            self.hits[mode] += 1
            if mode in self.MODES:
                await getattr(self, "_" + mode)(reader, writer, index)
            else:
                writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        except ConnectionError:
            pass  # the client hung up, as it should on most of these
        except asyncio.CancelledError:
            # Only __aexit__ cancels, and Python 3.11's start_server reports a
            # handler that ends cancelled as an error.
            pass
        finally:
            # Unsent bytes are flushed first; after "reset", close sends RST.
            writer.close()
            try:
                await asyncio.wait_for(writer.wait_closed(), timeout=5)
            except (TimeoutError, ConnectionError):
                pass
            finally:
                # what a client that stopped reading left unsent
                writer.transport.abort()
                self._connections.discard(task)

    async def _hang(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        # Until the client gives up: the connection is not left behind.
        while await reader.read(_CHUNK):
            pass

    async def _trickle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        head = b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Trickle: "
        # then the last header's value grows for ever
        while True:
            for byte in head:
                writer.write(bytes([byte]))
                await writer.drain()
                await asyncio.sleep(0.2)
            head = b"z"

    async def _slow_headers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while True:
            writer.write(b"X-Slow-%d: %d\r\n" % (n, n))
            await writer.drain()
            n += 1
            await asyncio.sleep(0.5)

    async def _endless_headers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\n")
        n = 0
        while True:
            writer.write(b"".join(b"X-Endless-%d: %s\r\n" % (n + i, b"v" * 100) for i in range(100)))
            await writer.drain()
            n += 100

    async def _close_after_headers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        # A 5xx: a 2xx counts by its status alone (the body is never read),
        # and what this mode tests is the cut, not the verdict.
        writer.write(b"HTTP/1.1 500 Internal Server Error\r\nContent-Length: 1000\r\n\r\npartial")
        await writer.drain()

    async def _reset(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        # Linger on with a zero timeout: close() sends RST instead of FIN.
        writer.get_extra_info("socket").setsockopt(
            socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0)
        )

    async def _huge_body(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
        chunk = b"%x\r\n%s\r\n" % (_CHUNK, b"x" * _CHUNK)
        for _ in range(self._huge_body_bytes // _CHUNK):
            writer.write(chunk)
            self.huge_body_sent += _CHUNK
            await writer.drain()
        writer.write(b"0\r\n\r\n")
        await writer.drain()

    async def _garbage_retry_after(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        value = RETRY_AFTER_VALUES[index % len(RETRY_AFTER_VALUES)]
        writer.write(
            b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: %s\r\n"
            b"Content-Length: 0\r\nConnection: close\r\n\r\n" % value
        )
        await writer.drain()

    async def _garbage_headers(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        answer = GARBAGE_HEADER_ANSWERS[index % len(GARBAGE_HEADER_ANSWERS)]
        writer.write(answer + b"Connection: close\r\n\r\n")
        await writer.drain()

    async def _garbage_status(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int
    ) -> None:
        line = GARBAGE_STATUS_LINES[index % len(GARBAGE_STATUS_LINES)]
        writer.write(line + b"\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        await writer.drain()

    async def _http09(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        # HTTP/0.9: no status line and no headers, only a body, then close.
        writer.write(b'{"ok": true}\n')
        await writer.drain()

    async def _not_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, index: int) -> None:
        writer.write(self._random.randbytes(4096))
        await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> str | None:
    """The mode a request asks for, after reading all of it (so that what
    follows is an answer, not a reaction to a half-sent request); ``None``
    if the client went away first."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError):
        return None
    request_line, *header_lines = head.decode("latin-1").split("\r\n")
    length = 0
    for line in header_lines:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    try:
        await reader.readexactly(length)
    except asyncio.IncompleteReadError:
        return None
    parts = request_line.split(" ")
    path = parts[1] if len(parts) == 3 else "/"
    return path.lstrip("/").split("/")[0].split("?")[0]

"""Real HTTP receivers on loopback that record what they get."""

from __future__ import annotations

import asyncio
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field

from aiohttp import web


@dataclass(frozen=True)
class Answer:
    """How a receiver path answers: after ``delay`` seconds, ``status`` with
    ``headers`` and a body of ``body_bytes``; ``hang`` never answers."""

    status: int = 200
    delay: float = 0.0
    headers: dict[str, str] = field(default_factory=dict)
    body_bytes: int = 0
    hang: bool = False


@dataclass(frozen=True)
class Received:
    path: str
    headers: dict[str, str]
    body: bytes
    at: float


Behaviour = Answer | Callable[[int], Answer]


class Receiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host = host
        self.received: list[Received] = []
        self.behaviours: dict[str, Behaviour] = {}
        self.in_flight: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)
        self._counts: dict[str, int] = defaultdict(int)
        self.arrived = asyncio.Event()
        app = web.Application()
        app.router.add_route("*", "/{tail:.*}", self._handle)
        # Handlers that hang on purpose must not hold up teardown.
        self._runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        self.port = 0

    def url(self, path: str) -> str:
        return f"http://{self.host}:{self.port}/{path.lstrip('/')}"

    def on(self, path: str, behaviour: Behaviour) -> str:
        self.behaviours["/" + path.lstrip("/")] = behaviour
        return self.url(path)

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
        answer = behaviour(index) if callable(behaviour) else behaviour
        self.in_flight[path] += 1
        self.peak[path] = max(self.peak[path], self.in_flight[path])
        try:
            if answer.hang:
                await asyncio.sleep(3600)
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

    async def __aenter__(self) -> Receiver:
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, 0)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

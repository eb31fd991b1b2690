"""A receiver process serving any number of endpoint paths.

Paths under ``/slow/`` answer after ``--slow-delay`` seconds, every other path
at once (204). Paths under ``/busy/`` are a receiver that takes calls up to
a limit: with ``?open=N&delay=S`` a call answers 204 after S seconds while
no more than N calls of that path are open, and 429 at once beyond them
(with ``&retry_after=V``, a ``Retry-After: V`` header on the 429). Each POST
is measured on arrival: the delivery lag is arrival time minus the publish
time the benchmark put in the event's ``data.t``; its path and the status
it was answered with are kept beside it.

Paths under ``/c/`` (the correlated incident, bench/correlated.py) behave as
the driver last said with ``POST /_behave``: healthy (204 at once), slow
(204 after the delay given for that path) or hanging (no answer until the
caller gives up or the behaviour changes). The URL stays; the receiver's
behaviour changes, as in an incident.

Control API (for the benchmark driver, same port):
- ``GET /_stats``: arrivals and slow in-flight samples of the current epoch.
- ``POST /_behave``: ``{"slow": {path: seconds}, "hang": [path]}``, the
  behaviour of ``/c/`` paths from now on (any other is healthy). Hanging
  calls still open are released.
- ``POST /_reset``: start a new epoch. Slow handlers of an older epoch may
  still be sleeping (aiohttp does not cancel a handler when its client goes
  away), so in-flight counts are kept per epoch and old ones are ignored.

Run: ``python -m bench.receiver --port 8080 --slow-delay 28``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import time
from collections import defaultdict

from aiohttp import web

# The kind of path each arrival came to (the third field of an arrival).
KIND_HEALTHY, KIND_SLOW, KIND_BUSY, KIND_HANG = 0, 1, 2, 3
KINDS = {"slow": KIND_SLOW, "busy": KIND_BUSY}


class Recorder:
    def __init__(self, slow_delay: float, sample_seconds: float) -> None:
        self.slow_delay = slow_delay
        self.sample_seconds = sample_seconds
        self.epoch = 0
        self.in_flight: dict[int, int] = defaultdict(int)
        # Open calls of each /busy/ path, per epoch as in_flight.
        self.busy_open: dict[tuple[int, str], int] = defaultdict(int)
        # Hanging calls open, per epoch as in_flight.
        self.hang_open: dict[int, int] = defaultdict(int)
        # The /c/ paths' behaviour: path -> seconds to answer (slow), and
        # the paths that hang; `changed` is set when it changes.
        self.slow_paths: dict[str, float] = {}
        self.hang_paths: set[str] = set()
        self.changed = asyncio.Event()
        self._reset()

    def _reset(self) -> None:
        self.started = time.time()
        # [arrival, lag, kind]: kept raw, the driver computes percentiles.
        self.arrivals: list[tuple[float, float, int]] = []
        # The path and the status answered beside each arrival.
        self.paths: list[str] = []
        self.statuses: list[int] = []
        # The event's data.n beside each arrival (None without one): lets a
        # driver time from its own clock reading, such as the commit.
        self.numbers: list[int | None] = []
        self.samples: list[tuple[float, int]] = []
        self.hang_samples: list[tuple[float, int]] = []
        self.peak = 0
        self.busy_peak = 0

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.read()
        now = time.time()
        kind, delay = self.kind(request.path)
        try:
            data = json.loads(body)["data"]
            lag = now - data["t"]
        except (ValueError, KeyError, TypeError):
            data, lag = {}, float("nan")
        self.arrivals.append((now, lag, kind))
        self.numbers.append(data.get("n"))
        self.paths.append(request.path)
        if kind == KIND_BUSY:
            return await self.busy(request)
        self.statuses.append(204)
        if kind == KIND_HANG:
            return await self.hang(request)
        if kind == KIND_HEALTHY:
            return web.Response(status=204)
        epoch = self.epoch
        self.in_flight[epoch] += 1
        if epoch == self.epoch:
            self.peak = max(self.peak, self.in_flight[epoch])
        try:
            await asyncio.sleep(delay)
        finally:
            self.in_flight[epoch] -= 1
        return web.Response(status=204)

    def kind(self, path: str) -> tuple[int, float]:
        """The kind of a call to ``path`` now, and how long a slow one takes."""
        prefix = path.split("/", 2)[1]
        if prefix != "c":
            return KINDS.get(prefix, KIND_HEALTHY), self.slow_delay
        if path in self.hang_paths:
            return KIND_HANG, 0.0
        if path in self.slow_paths:
            return KIND_SLOW, self.slow_paths[path]
        return KIND_HEALTHY, 0.0

    async def hang(self, request: web.Request) -> web.Response:
        """No answer while the path hangs and the caller waits. aiohttp does
        not cancel a handler whose client went away, so the connection is
        looked at every second: a call the worker gave up on is not counted
        as open."""
        epoch, changed = self.epoch, self.changed
        self.hang_open[epoch] += 1
        try:
            while (
                not changed.is_set() and request.transport is not None and not request.transport.is_closing()
            ):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(changed.wait(), 1.0)
        finally:
            self.hang_open[epoch] -= 1
        return web.Response(status=204)

    async def behave(self, request: web.Request) -> web.Response:
        body = await request.json()
        self.slow_paths = {str(p): float(s) for p, s in body.get("slow", {}).items()}
        self.hang_paths = {str(p) for p in body.get("hang", [])}
        self.changed.set()
        self.changed = asyncio.Event()
        return web.json_response({"slow": len(self.slow_paths), "hang": len(self.hang_paths)})

    async def busy(self, request: web.Request) -> web.Response:
        """A /busy/ call: taken while its path has room, 429 beyond."""
        query = request.query
        key = (self.epoch, request.path)
        if self.busy_open[key] >= int(query.get("open", "1")):
            self.statuses.append(429)
            retry_after = query.get("retry_after")
            return web.Response(status=429, headers={"Retry-After": retry_after} if retry_after else None)
        self.statuses.append(204)
        self.busy_open[key] += 1
        self.busy_peak = max(self.busy_peak, self.busy_open[key])
        try:
            await asyncio.sleep(float(query.get("delay", "0")))
        finally:
            self.busy_open[key] -= 1
        return web.Response(status=204)

    async def stats(self, _request: web.Request) -> web.Response:
        return web.json_response(
            {
                "started": self.started,
                "arrivals": self.arrivals,
                "numbers": self.numbers,
                "paths": self.paths,
                "statuses": self.statuses,
                "slow_in_flight": self.samples,
                "hang_in_flight": self.hang_samples,
                "slow_peak": self.peak,
                "busy_peak": self.busy_peak,
            }
        )

    async def reset(self, _request: web.Request) -> web.Response:
        self.epoch += 1
        self.slow_paths, self.hang_paths = {}, set()
        self.changed.set()
        self.changed = asyncio.Event()
        self._reset()
        return web.json_response({"epoch": self.epoch})

    async def sample(self) -> None:
        """Slow in-flight over time; the exact peak is kept on every arrival."""
        while True:
            now = time.time()
            self.samples.append((now, self.in_flight[self.epoch]))
            self.hang_samples.append((now, self.hang_open[self.epoch]))
            await asyncio.sleep(self.sample_seconds)


async def serve(port: int, slow_delay: float, sample_seconds: float) -> None:
    recorder = Recorder(slow_delay, sample_seconds)
    app = web.Application(client_max_size=1024**2)
    app.router.add_get("/_stats", recorder.stats)
    app.router.add_post("/_reset", recorder.reset)
    app.router.add_post("/_behave", recorder.behave)
    app.router.add_post("/{tail:.*}", recorder.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    # A deep backlog: a burst of new connections must not be refused.
    await web.TCPSite(runner, "127.0.0.1", port, backlog=4096).start()
    sampler = asyncio.create_task(recorder.sample())
    print(f"receiver ready on {port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        sampler.cancel()
        await runner.cleanup()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--slow-delay", type=float, default=28.0, help="seconds a /slow/ path takes")
    parser.add_argument("--sample-seconds", type=float, default=0.1)
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(serve(args.port, args.slow_delay, args.sample_seconds))


if __name__ == "__main__":
    main()

"""The load generator of ``bench/ingest.py``: POSTs events to the ingest API
and prints what came back as JSON.

Closed loop (``--concurrency`` requests in flight, each sent as soon as the
previous one was answered: the most the server takes), or open loop
(``--rate`` requests per second on a fixed schedule, whatever the answers
take: latency at a given load, each timed from its scheduled start so that a
slow answer cannot hide the requests queued behind it). Keep-alive
connections of one aiohttp session; its own CPU time is reported, so that
a run can tell whether the generator was the bottleneck.

Run: ``python -m bench.ingest_load --url http://127.0.0.1:8080 --token ... --concurrency 64``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field

import aiohttp
import uvloop

from bench.common import summary

# A typical small event: an order with a few fields (about 250 bytes).
EVENT = (
    '{"id":"%s","type":"order.updated","tenant":"t0",'
    '"data":{"n":%d,"order":{"id":%d,"status":"paid","total":"129.90","note":"%s"}}}'
)


@dataclass
class Tally:
    """Answers within the measured window, and all answers."""

    window: tuple[float, float]
    statuses: Counter[int] = field(default_factory=Counter)
    events: int = 0
    latencies: list[float] = field(default_factory=list)
    accepted_total: int = 0

    def record(self, status: int, events: int, started: float, ended: float) -> None:
        if status == 202:
            self.accepted_total += events
        if not self.window[0] <= ended < self.window[1]:
            return
        self.statuses[status] += 1
        if status == 202:
            self.events += events
            self.latencies.append((ended - started) * 1000)


class Bodies:
    def __init__(self, batch: int) -> None:
        self.batch = batch
        self.prefix = uuid.uuid4().hex[:8]
        self.n = 0
        self.path = "/v1/events/batch" if batch > 1 else "/v1/events"

    def next(self) -> bytes:
        events = []
        for _ in range(self.batch):
            self.n += 1
            events.append(EVENT % (f"{self.prefix}-{self.n}", self.n, self.n, "x" * 64))
        if self.batch == 1:
            return events[0].encode()
        return ('{"events":[' + ",".join(events) + "]}").encode()


async def send(http: aiohttp.ClientSession, url: str, body: bytes) -> int:
    async with http.post(url, data=body) as response:
        await response.read()
        return response.status


async def closed_loop(args: argparse.Namespace, http: aiohttp.ClientSession, tally: Tally) -> None:
    bodies = Bodies(args.batch)
    url = args.url + bodies.path
    end = tally.window[1]

    async def client() -> None:
        while time.monotonic() < end:
            started = time.monotonic()
            status = await send(http, url, bodies.next())
            tally.record(status, args.batch, started, time.monotonic())

    await asyncio.gather(*(client() for _ in range(args.concurrency)))


async def open_loop(args: argparse.Namespace, http: aiohttp.ClientSession, tally: Tally) -> None:
    bodies = Bodies(args.batch)
    url = args.url + bodies.path
    start, end = time.monotonic(), tally.window[1]
    pending: set[asyncio.Task[None]] = set()

    async def one(scheduled: float, body: bytes) -> None:
        status = await send(http, url, body)
        tally.record(status, args.batch, scheduled, time.monotonic())

    n = 0
    while True:
        scheduled = start + n / args.rate
        if scheduled >= end:
            break
        delay = scheduled - time.monotonic()
        if delay > 0:
            await asyncio.sleep(delay)
        task = asyncio.create_task(one(scheduled, bodies.next()))
        pending.add(task)
        task.add_done_callback(pending.discard)
        n += 1
    await asyncio.gather(*pending)


async def run(args: argparse.Namespace) -> dict:
    connector = aiohttp.TCPConnector(limit=args.concurrency, force_close=False)
    timeout = aiohttp.ClientTimeout(total=60, connect=10, sock_read=60)
    headers = {"Authorization": f"Bearer {args.token}", "Content-Type": "application/json"}
    cpu_before = resource.getrusage(resource.RUSAGE_SELF)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=headers) as http:
        now = time.monotonic()
        tally = Tally((now + args.warmup, now + args.warmup + args.seconds))
        await (open_loop if args.rate else closed_loop)(args, http, tally)
    cpu = resource.getrusage(resource.RUSAGE_SELF)
    cpu_seconds = (cpu.ru_utime - cpu_before.ru_utime) + (cpu.ru_stime - cpu_before.ru_stime)
    return {
        "events": tally.events,
        "events_per_second": tally.events / args.seconds,
        "requests_per_second": sum(tally.statuses.values()) / args.seconds,
        "statuses": {str(k): v for k, v in sorted(tally.statuses.items())},
        "latency_ms": summary(tally.latencies),
        "accepted_total": tally.accepted_total,
        # Of the whole run (warm-up included), per second of it: 1.0 is a full core.
        "generator_cpu_share": cpu_seconds / (args.warmup + args.seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--url", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--warmup", type=float, default=2)
    parser.add_argument("--concurrency", type=int, default=64, help="connections (and requests in flight)")
    parser.add_argument("--batch", type=int, default=1, help="events per request (>1: /v1/events/batch)")
    parser.add_argument("--rate", type=float, default=0, help="open loop: requests per second")
    args = parser.parse_args()
    print(json.dumps(uvloop.run(run(args))))


if __name__ == "__main__":
    main()

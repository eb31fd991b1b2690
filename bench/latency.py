"""Latency when idle: publish one event, time until the receiver has it.

One endpoint, one ``hooklane worker`` with its defaults (the wake-up is
publish's NOTIFY; the 1 s poll is only the fallback), an aiohttp receiver in
this process so that both ends read the same clock. Each event is published
in its own transaction on an open connection, timed from just before the
transaction starts to the receiver's handler; between events the system goes
idle for a random pause, so no event finds the worker awake.

Run: ``python -m bench.latency --preset full``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from dataclasses import asdict, dataclass, replace

import asyncpg
from aiohttp import web

import hooklane
from bench.common import (
    create_endpoints,
    free_ports,
    fresh_database,
    machine,
    postgres_server,
    run_and_report,
    start_worker,
    stop_process,
    summary,
    wait_workers_ready,
)


@dataclass(frozen=True)
class Config:
    events: int
    pause: tuple[float, float]  # idle seconds between events, uniform in this range
    warmup: int = 3  # first events, not counted: connection setup and plan caching


PRESETS = {
    "full": Config(events=200, pause=(0.1, 0.3)),
    "smoke": Config(events=10, pause=(0.05, 0.1), warmup=1),
}


class Arrivals:
    """The receiver: resolves the waiter of each event id on arrival."""

    def __init__(self) -> None:
        self.waiting: dict[int, asyncio.Future[float]] = {}

    async def handle(self, request: web.Request) -> web.Response:
        now = time.perf_counter()
        n = json.loads(await request.read())["data"]["n"]
        fut = self.waiting.pop(n, None)
        if fut is not None and not fut.done():
            fut.set_result(now)
        return web.Response(status=204)


async def measure(dsn: str, url_base: str, arrivals: Arrivals, cfg: Config) -> list[float]:
    conn = await asyncpg.connect(dsn)
    latencies = []
    try:
        for n in range(cfg.events + cfg.warmup):
            await asyncio.sleep(random.uniform(*cfg.pause))
            fut: asyncio.Future[float] = asyncio.get_running_loop().create_future()
            arrivals.waiting[n] = fut
            started = time.perf_counter()
            async with conn.transaction():
                await hooklane.publish(conn, tenant="t0", type="order.updated", data={"n": n})
            arrived = await asyncio.wait_for(fut, timeout=10)
            if n >= cfg.warmup:
                latencies.append(arrived - started)
    finally:
        await conn.close()
    return latencies


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.events:
        cfg = replace(cfg, events=args.events)
    arrivals = Arrivals()
    app = web.Application()
    app.router.add_post("/{tail:.*}", arrivals.handle)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        with postgres_server(args.dsn) as server:
            async with fresh_database(server, "latency") as dsn:
                conn = await asyncpg.connect(dsn)
                try:
                    await create_endpoints(conn, [f"http://127.0.0.1:{port}/h/0"])
                finally:
                    await conn.close()
                worker = start_worker(dsn)
                try:
                    await wait_workers_ready(dsn, 1)
                    latencies = await measure(dsn, f"http://127.0.0.1:{port}", arrivals, cfg)
                finally:
                    stop_process(worker)
    finally:
        await runner.cleanup()
    s = summary(latencies)
    return {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "latency_ms": {k: (v * 1000 if k != "n" else v) for k, v in s.items()},
        "target_p50_under_20ms": s["p50"] < 0.020,
        "latencies_ms": [round(v * 1000, 2) for v in latencies],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description="publish-to-receiver latency on an idle system")
    parser.add_argument("--preset", choices=sorted(PRESETS), default="full")
    parser.add_argument("--dsn", help="a server to create the benchmark database on (default: LocalPostgres)")
    parser.add_argument("--events", type=int, help="events to time, overriding the preset")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    run_and_report(main_async, args, lambda result: {k: v for k, v in result.items() if k != "latencies_ms"})


if __name__ == "__main__":
    main()

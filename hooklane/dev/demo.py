"""A local demo of the main job, with nothing but this machine.

It starts a throwaway PostgreSQL, a receiver serving many endpoints (one of
them slow, like the seed's incident), a worker with 16 delivery slots, and
publishes a steady stream of events for a while. Every few seconds it prints
what `hooklane status` prints; at the end, the healthy endpoints' delivery lag
and the slow endpoint's peak concurrency.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import subprocess
import sys
import time
from collections import defaultdict
from collections.abc import Sequence

import asyncpg
from aiohttp import web

import hooklane
from hooklane import store
from hooklane.dev.postgres import LocalPostgres
from hooklane.spec import EndpointSpec

SECRET = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw"


class DemoReceiver:
    """One server for every endpoint path; /slow answers after a delay."""

    def __init__(self, slow_seconds: float) -> None:
        self.slow_seconds = slow_seconds
        self.lags: dict[str, list[float]] = defaultdict(list)
        self.in_flight: dict[str, int] = defaultdict(int)
        self.peak: dict[str, int] = defaultdict(int)

    async def handle(self, request: web.Request) -> web.Response:
        path = request.match_info["name"]
        body = await request.json()
        self.lags[path].append(time.time() - body["data"]["published_at"])
        self.in_flight[path] += 1
        self.peak[path] = max(self.peak[path], self.in_flight[path])
        try:
            if path == "slow":
                await asyncio.sleep(self.slow_seconds)
            return web.Response(status=204)
        finally:
            self.in_flight[path] -= 1


async def _status(dsn: str) -> None:
    result = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "hooklane.cli",
        "status",
        env={**os.environ, "HOOKLANE_DATABASE_URL": dsn},
        stdout=subprocess.PIPE,
    )
    out, _ = await result.communicate()
    lines = out.decode().splitlines()
    print("\n".join(lines[:6]), flush=True)


def _percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(p / 100 * len(ordered)))] if ordered else float("nan")


async def run(endpoints: int, seconds: float, rate: float, slow_seconds: float) -> None:
    with LocalPostgres() as pg:
        conn = await store.connect(pg.dsn)
        await store.migrate(conn)
        receiver = DemoReceiver(slow_seconds)
        app = web.Application()
        app.router.add_post("/hooks/{name}", receiver.handle)
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=0.5)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        port = runner.addresses[0][1]
        names = ["slow", *[f"shop{i}" for i in range(endpoints - 1)]]
        for name in names:
            spec = EndpointSpec(
                namespace="demo", name=name, url=f"http://127.0.0.1:{port}/hooks/{name}", tenant=name
            )
            await store.upsert_endpoint(conn, spec, SECRET)
        print(
            f"PostgreSQL at {pg.dsn}; {endpoints} endpoints; /slow answers in {slow_seconds:g} s", flush=True
        )
        # The worker outlives this coroutine's awaits; starting it blocks for
        # a fork only.
        worker = subprocess.Popen(  # noqa: ASYNC220
            [sys.executable, "-m", "hooklane.cli", "worker"],
            # The demo's receiver is on loopback, which only an explicit
            # allow-list opens to deliveries.
            env={
                **os.environ,
                "HOOKLANE_DATABASE_URL": pg.dsn,
                "HOOKLANE_WORKER_CONCURRENCY": "16",
                "HOOKLANE_METRICS_PORT": "0",
                "HOOKLANE_ALLOWED_NETWORKS": "127.0.0.0/8",
            },
        )
        try:
            await _publish_for(conn, pg.dsn, names, seconds, rate)
            await asyncio.sleep(2)
        finally:
            worker.terminate()
            worker.wait(timeout=slow_seconds + 15)
            await conn.close()
            await runner.cleanup()
        healthy = [lag for name, lags in receiver.lags.items() if name != "slow" for lag in lags]
        print(
            f"\nhealthy endpoints: {len(healthy)} deliveries, lag p50 {_percentile(healthy, 50) * 1000:.0f} ms, "
            f"p99 {_percentile(healthy, 99) * 1000:.0f} ms, max {max(healthy, default=0) * 1000:.0f} ms"
        )
        print(
            f"slow endpoint: {len(receiver.lags['slow'])} delivered, at most {receiver.peak['slow']} in flight "
            f"(its maxConcurrency is 4), the rest still queued for it alone"
        )


async def _publish_for(
    conn: asyncpg.Connection, dsn: str, names: list[str], seconds: float, rate: float
) -> None:
    started = time.monotonic()
    next_status = started
    sent = 0
    while (elapsed := time.monotonic() - started) < seconds:
        # Half of the traffic goes to the slow endpoint, as in the incident.
        tenant = "slow" if sent % 2 == 0 else names[1 + sent // 2 % (len(names) - 1)]
        await hooklane.publish(
            conn, tenant=tenant, type="order.updated", data={"n": sent, "published_at": time.time()}
        )
        sent += 1
        if time.monotonic() >= next_status:
            print(f"\n--- {elapsed:4.0f} s, {sent} events published", flush=True)
            await _status(dsn)
            next_status += 5
        await asyncio.sleep(max(0.0, started + sent / rate - time.monotonic()))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hooklane dev demo", description=__doc__)
    parser.add_argument("--endpoints", type=int, default=50)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rate", type=float, default=40.0, help="events per second")
    parser.add_argument("--slow-seconds", type=float, default=5.0)
    args = parser.parse_args(argv)
    asyncio.run(run(args.endpoints, args.seconds, args.rate, args.slow_seconds))
    return 0


if __name__ == "__main__":
    sys.exit(main())

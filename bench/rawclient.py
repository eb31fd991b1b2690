"""The ceiling for a Python sender: a bare aiohttp client, nothing else.

Posts ``--count`` pre-built bodies (the same JSON body and Standard Webhooks
headers a Hooklane delivery carries) to ``--endpoints`` paths of a receiver
with ``--concurrency`` requests in flight, and prints the rate as JSON. No
database, no bookkeeping: whatever the worker does beyond this is its cost.

Run: ``python -m bench.rawclient --base http://127.0.0.1:8080 --count 20000``
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import UTC, datetime

import aiohttp
import uvloop

from bench.common import SECRET
from hooklane.signing import event_body, parse_secret, sign

DATA = '{"n":%d,"order":{"id":%d,"status":"paid","note":"%s"}}'


def bodies(count: int) -> list[tuple[bytes, dict[str, str]]]:
    key = parse_secret(SECRET)
    now = datetime.now(UTC)
    out = []
    for n in range(count):
        msg_id = f"evt_{n}"
        body = event_body(msg_id, "order.updated", now, DATA % (n, n, "x" * 160))
        ts = int(time.time())
        out.append(
            (
                body,
                {
                    "webhook-id": msg_id,
                    "webhook-timestamp": str(ts),
                    "webhook-signature": sign(key, msg_id, ts, body),
                },
            )
        )
    return out


async def blast(base: str, endpoints: int, count: int, concurrency: int) -> dict:
    work = bodies(count)
    connector = aiohttp.TCPConnector(limit=0, limit_per_host=0)
    statuses: dict[int, int] = {}
    async with aiohttp.ClientSession(
        connector=connector, headers={"Content-Type": "application/json"}
    ) as http:
        next_index = 0

        async def run() -> None:
            nonlocal next_index
            while next_index < count:
                n = next_index
                next_index += 1
                body, headers = work[n]
                async with http.post(f"{base}/h/{n % endpoints}", data=body, headers=headers) as r:
                    statuses[r.status] = statuses.get(r.status, 0) + 1

        started = time.perf_counter()
        await asyncio.gather(*(run() for _ in range(concurrency)))
        elapsed = time.perf_counter() - started
    return {"count": count, "seconds": elapsed, "per_second": count / elapsed, "statuses": statuses}


def main() -> None:
    parser = argparse.ArgumentParser(description="bare aiohttp client: the sender's ceiling")
    parser.add_argument("--base", required=True, help="receiver base URL")
    parser.add_argument("--endpoints", type=int, default=1000)
    parser.add_argument("--count", type=int, default=20000)
    parser.add_argument("--concurrency", type=int, default=64)
    args = parser.parse_args()
    # The worker's own event loop, so that the ceiling is a like-for-like one.
    print(json.dumps(uvloop.run(blast(args.base, args.endpoints, args.count, args.concurrency))))


if __name__ == "__main__":
    main()

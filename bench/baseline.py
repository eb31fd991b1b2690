"""The naive design Hooklane replaces (seed 001), for comparison only.

One FIFO table of deliveries for every endpoint; a worker takes the oldest
due rows in batches with FOR UPDATE SKIP LOCKED and sends them with a fixed
number of slots, with no per-endpoint limit. It is given every advantage the
seed's sketch lacks, so that the comparison is about the queue shape only:
the slots are refilled as soon as one frees (not by a 30 s cron, and not a
batch at a time), it polls every 50 ms, it has a partial index on the FIFO,
and it sends the same signed body as Hooklane with the same aiohttp settings.

Run: ``python -m bench.baseline --dsn postgresql://... --slots 16``
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os

import asyncpg
import uvloop

from hooklane.guard import parse_networks
from hooklane.signing import event_body, parse_secret
from hooklane.worker.sender import Sender

SCHEMA = """
CREATE TABLE IF NOT EXISTS baseline_endpoints (
    id              integer PRIMARY KEY,
    url             text NOT NULL,
    secret          text NOT NULL,
    timeout_seconds integer NOT NULL DEFAULT 5
);
CREATE TABLE IF NOT EXISTS baseline_deliveries (
    id              bigserial PRIMARY KEY,
    endpoint_id     integer NOT NULL REFERENCES baseline_endpoints (id),
    event_id        text NOT NULL,
    event_type      text NOT NULL,
    payload         jsonb NOT NULL,
    status          text NOT NULL DEFAULT 'pending',
    attempts        integer NOT NULL DEFAULT 0,
    next_attempt_at timestamptz NOT NULL DEFAULT now(),
    last_error      text,
    created_at      timestamptz NOT NULL DEFAULT now()
);
CREATE INDEX IF NOT EXISTS baseline_fifo ON baseline_deliveries (id) WHERE status = 'pending';
"""

# The seed's job: the oldest due rows, whoever they are for.
RESERVE = """
UPDATE baseline_deliveries d
SET status = 'sending', attempts = d.attempts + 1
FROM (SELECT id FROM baseline_deliveries
      WHERE status = 'pending' AND next_attempt_at <= now()
      ORDER BY id
      LIMIT $1
      FOR UPDATE SKIP LOCKED) s,
     baseline_endpoints ep
WHERE d.id = s.id AND ep.id = d.endpoint_id
RETURNING d.id, d.event_id, d.event_type, d.payload::text AS payload, d.attempts,
          d.created_at, ep.url, ep.secret, ep.timeout_seconds
"""

PUBLISH = """
INSERT INTO baseline_deliveries (endpoint_id, event_id, event_type, payload)
VALUES ($1, $2, $3, $4::jsonb)
"""

SEED_BATCH = 50  # the seed's .limit(50)


async def install(conn: asyncpg.Connection, endpoints: list[tuple[int, str, int]], secret: str) -> None:
    """Create the baseline tables and its endpoints: (id, url, timeout)."""
    await conn.execute(SCHEMA)
    await conn.executemany(
        "INSERT INTO baseline_endpoints (id, url, secret, timeout_seconds) VALUES ($1, $2, $3, $4)",
        [(i, url, secret, timeout) for i, url, timeout in endpoints],
    )


async def publish(conn: asyncpg.Connection, endpoint_id: int, event_id: str, type: str, data: dict) -> None:
    """The baseline's outbox write: one row into the FIFO."""
    await conn.execute(PUBLISH, endpoint_id, event_id, type, json.dumps(data, separators=(",", ":")))


class BaselineWorker:
    def __init__(self, pool: asyncpg.Pool, slots: int, poll: float) -> None:
        self.pool = pool
        self.slots = slots
        self.poll = poll
        # The same destination guard as Hooklane's worker, loopback allowed
        # by bench.common for the benchmark's receivers.
        self.sender = Sender(parse_networks(os.environ.get("HOOKLANE_ALLOWED_NETWORKS", "")))
        self.in_flight: set[asyncio.Task] = set()
        self.freed = asyncio.Event()
        self.keys: dict[str, bytes] = {}

    async def run(self) -> None:
        while True:
            free = self.slots - len(self.in_flight)
            rows = []
            if free > 0:
                async with self.pool.acquire() as conn:
                    rows = await conn.fetch(RESERVE, min(free, SEED_BATCH))
                for row in rows:
                    task = asyncio.create_task(self.deliver(row))
                    self.in_flight.add(task)
                    task.add_done_callback(self._done)
            if rows and len(rows) == free:
                continue
            self.freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.freed.wait(), timeout=self.poll)

    def _done(self, task: asyncio.Task) -> None:
        self.in_flight.discard(task)
        self.freed.set()

    async def deliver(self, row: asyncpg.Record) -> None:
        key = self.keys.get(row["secret"]) or self.keys.setdefault(row["secret"], parse_secret(row["secret"]))
        body = event_body(row["event_id"], row["event_type"], row["created_at"], row["payload"])
        attempt = await self.sender.send(row["url"], key, row["event_id"], body, row["timeout_seconds"])
        async with self.pool.acquire() as conn:
            if attempt.status is not None and 200 <= attempt.status < 300:
                await conn.execute(
                    "UPDATE baseline_deliveries SET status = 'delivered' WHERE id = $1", row["id"]
                )
            else:
                # The seed's backoff: 30 s doubling.
                await conn.execute(
                    "UPDATE baseline_deliveries SET status = 'pending', last_error = $2,"
                    " next_attempt_at = now() + make_interval(secs => 30 * 2 ^ ($3 - 1)) WHERE id = $1",
                    row["id"],
                    attempt.error or f"HTTP {attempt.status}",
                    row["attempts"],
                )


async def main_async(dsn: str, slots: int, poll: float) -> None:
    pool = await asyncpg.create_pool(dsn, min_size=2, max_size=max(4, slots // 4))
    worker = BaselineWorker(pool, slots, poll)
    try:
        await worker.run()
    finally:
        await worker.sender.close()
        await pool.close()


def main() -> None:
    parser = argparse.ArgumentParser(description="the naive FIFO baseline worker (seed 001)")
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--slots", type=int, default=16, help="deliveries in flight at once")
    parser.add_argument("--poll", type=float, default=0.05, help="seconds between polls when idle")
    args = parser.parse_args()
    # The worker's own event loop: the comparison is about the queue's shape.
    with contextlib.suppress(KeyboardInterrupt):
        uvloop.run(main_async(args.dsn, args.slots, args.poll))


if __name__ == "__main__":
    main()

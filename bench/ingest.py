"""Ingest: events per second one ``hooklane api`` process accepts, each 202
sent after COMMIT, with ``synchronous_commit`` on; and the ack latency at a
fixed rate. Against the ceiling of the same aiohttp server and request
handling without the database (``bench/ingest_ceiling.py``), in the same run.

Runs, each with ``bench/ingest_load.py`` as a process of its own:
single-event requests from many concurrent clients (closed loop), batch
requests (closed loop), then single events at a fixed rate (open loop) for
the latency. One endpoint matches every event, so each commit stores an
event and a delivery, as in production; no worker runs, the deliveries
wait. Every 202 is then looked up: the database must hold each event
acknowledged.

Run: ``python -m bench.ingest --preset full`` (``quick`` first; ``smoke`` is
what the tests run).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import secrets
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from urllib.parse import urlsplit

import asyncpg
import psutil

from bench.common import (
    REPO,
    create_endpoints,
    free_ports,
    fresh_database,
    machine,
    postgres_server,
    python_module,
    run_and_report,
    start_module,
    stop_process,
    worker_env,
)

TARGET_EVENTS_PER_SECOND = 3000
TARGET_P99_MS = 50


@dataclass(frozen=True)
class Config:
    seconds: float  # measured, per run
    warmup: float  # before each run's window: connections, plans, the pool
    concurrency: int  # single-event clients in flight
    batch: int  # events per batch request
    batch_concurrency: int  # batch requests in flight
    rate: float  # events per second of the latency run (one per request)


PRESETS = {
    "full": Config(seconds=20, warmup=5, concurrency=64, batch=100, batch_concurrency=8, rate=1000),
    "quick": Config(seconds=5, warmup=2, concurrency=64, batch=100, batch_concurrency=8, rate=1000),
    "smoke": Config(seconds=1, warmup=0.5, concurrency=8, batch=10, batch_concurrency=2, rate=100),
}


def postgres_master(dsn: str) -> int | None:
    """The pid of the Postgres server listening on the DSN's port."""
    port = urlsplit(dsn).port or 5432
    for conn in psutil.net_connections("tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def cpu_by_pid(pid: int | None, children: bool = False) -> dict[int, float]:
    """CPU seconds of a process (and of its children: Postgres' backends,
    which come and go with connections), by pid."""
    if pid is None:
        return {}
    found = {}
    with contextlib.suppress(psutil.Error):
        process = psutil.Process(pid)
        for p in [process, *(process.children() if children else [])]:
            with contextlib.suppress(psutil.Error):
                times = p.cpu_times()
                found[p.pid] = times.user + times.system
    return found


def cpu_spent(before: dict[int, float], after: dict[int, float]) -> float:
    # A backend born during the run counts from zero.
    return sum(seconds - before.get(pid, 0.0) for pid, seconds in after.items())


async def load(url: str, token: str, cfg: Config, **options: float) -> dict:
    """One run of the load generator, in a process of its own."""
    # A token may begin with "-", which argparse would take for an option.
    args = ["--url", url, f"--token={token}", "--seconds", str(cfg.seconds), "--warmup", str(cfg.warmup)]
    for name, value in options.items():
        args += [f"--{name}", str(value)]
    proc = start_module("bench.ingest_load", *args, stdout=subprocess.PIPE)
    out, _ = await asyncio.to_thread(proc.communicate)
    if proc.returncode != 0:
        raise RuntimeError(f"the load generator failed ({proc.returncode})")
    return json.loads(out)


async def measure(url: str, token: str, cfg: Config, server: int, postgres: int | None) -> dict:
    """The three runs against one server; CPU shares of the server and of
    Postgres over each whole run (1.0 is one core)."""
    runs = {}
    for name, options in (
        ("single", {"concurrency": cfg.concurrency}),
        ("batch", {"concurrency": cfg.batch_concurrency, "batch": cfg.batch}),
        ("rate", {"concurrency": 256, "rate": cfg.rate}),
    ):
        started = time.monotonic()
        server_before, postgres_before = cpu_by_pid(server), cpu_by_pid(postgres, children=True)
        result = await load(url, token, cfg, **options)
        elapsed = time.monotonic() - started
        server_cpu = cpu_spent(server_before, cpu_by_pid(server))
        postgres_cpu = cpu_spent(postgres_before, cpu_by_pid(postgres, children=True))
        result["server_cpu_share"] = round(server_cpu / elapsed, 2)
        result["postgres_cpu_share"] = round(postgres_cpu / elapsed, 2)
        result["load_average"] = os.getloadavg()[0]
        runs[name] = result
    return runs


async def wait_listening(url: str, proc: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args!r} exited with {proc.returncode}")
        try:
            await asyncio.to_thread(urllib.request.urlopen, url + "/v1/events", None, 1)
        except urllib.error.HTTPError:
            return  # 405 for a GET: it listens
        except OSError:
            await asyncio.sleep(0.1)
    raise RuntimeError(f"nothing listens at {url}")


@contextlib.contextmanager
def running(proc: subprocess.Popen) -> Iterator[subprocess.Popen]:
    try:
        yield proc
    finally:
        stop_process(proc, grace=10)


def start_api(env: dict[str, str], tree: Path | None = None) -> subprocess.Popen:
    """``hooklane api``, of ``tree`` (another commit's hooklane/) if given."""
    return subprocess.Popen(
        python_module("hooklane.cli", "--log-level", "WARNING", "api", tree=tree), env=env, cwd=REPO
    )


def scrape_commit_sizes(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    found = {}
    for line in text.splitlines():
        for part in ("sum", "count"):
            if line.startswith(f"hooklane_api_commit_events_{part} "):
                found[part] = float(line.split()[1])
    return found


async def main_async(args: argparse.Namespace) -> dict:
    cfg = PRESETS[args.preset]
    if args.seconds:
        cfg = replace(cfg, seconds=args.seconds)
    if args.concurrency:
        cfg = replace(cfg, concurrency=args.concurrency)
    token = secrets.token_urlsafe(24)
    result: dict = {
        "preset": args.preset,
        "config": asdict(cfg),
        "machine": machine(),
        "load_average_before": os.getloadavg(),
    }
    with postgres_server(args.dsn, durable=True) as server_dsn:
        async with fresh_database(server_dsn, "ingest", durable=True) as dsn:
            conn = await asyncpg.connect(dsn)
            try:
                await create_endpoints(conn, ["http://127.0.0.1:9/hook"])
                result["postgres_settings"] = {
                    name: await conn.fetchval(f"SHOW {name}") for name in ("synchronous_commit", "fsync")
                }
            finally:
                await conn.close()
            postgres = postgres_master(server_dsn)
            ceiling_port, api_port, metrics_port = free_ports(3)

            ceiling = start_module("bench.ingest_ceiling", "--port", str(ceiling_port), f"--token={token}")
            with running(ceiling):
                url = f"http://127.0.0.1:{ceiling_port}"
                await wait_listening(url, ceiling)
                result["ceiling"] = await measure(url, token, cfg, ceiling.pid, postgres)

            env = worker_env(
                dsn,
                api_host="127.0.0.1",
                api_port=str(api_port),
                api_tokens=token,
                api_drain_seconds="0",
                metrics_port=str(metrics_port),
            )
            api = start_api(env)
            with running(api):
                url = f"http://127.0.0.1:{api_port}"
                await wait_listening(url, api)
                result["api"] = await measure(url, token, cfg, api.pid, postgres)
                sizes = scrape_commit_sizes(metrics_port)
                result["events_per_commit"] = sizes["sum"] / sizes["count"] if sizes.get("count") else 0.0

            conn = await asyncpg.connect(dsn)
            try:
                result["stored"] = await conn.fetchval("SELECT count(*) FROM events")
            finally:
                await conn.close()
    result["acknowledged"] = sum(run["accepted_total"] for run in result["api"].values())
    result["summary"] = summarise(result)
    return result


def summarise(result: dict) -> dict:
    api, ceiling = result["api"], result["ceiling"]
    single = api["single"]["events_per_second"]
    return {
        "single_events_per_s": round(single),
        "single_ceiling_events_per_s": round(ceiling["single"]["events_per_second"]),
        "single_ratio": round(single / ceiling["single"]["events_per_second"], 2),
        "batch_events_per_s": round(api["batch"]["events_per_second"]),
        "batch_ceiling_events_per_s": round(ceiling["batch"]["events_per_second"]),
        "batch_ratio": round(api["batch"]["events_per_second"] / ceiling["batch"]["events_per_second"], 2),
        "rate_p50_ms": round(api["rate"]["latency_ms"]["p50"], 2),
        "rate_p99_ms": round(api["rate"]["latency_ms"]["p99"], 2),
        "rate_ceiling_p99_ms": round(ceiling["rate"]["latency_ms"]["p99"], 2),
        "events_per_commit": round(result["events_per_commit"], 1),
        "every_202_stored": result["stored"] == result["acknowledged"],
        "meets_single_target": single >= TARGET_EVENTS_PER_SECOND,
        "meets_p99_target": api["rate"]["latency_ms"]["p99"] < TARGET_P99_MS,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--preset", choices=sorted(PRESETS), default="quick")
    parser.add_argument(
        "--dsn", help="a server to create the benchmark database on (default: a new durable one)"
    )
    parser.add_argument("--seconds", type=float, help="override the preset's measured seconds per run")
    parser.add_argument("--concurrency", type=int, help="override the preset's single-event clients")
    parser.add_argument("--json", help="write the whole result here")
    args = parser.parse_args()
    run_and_report(main_async, args, lambda result: {"summary": result["summary"], **_brief(result)})


def _brief(result: dict) -> dict:
    return {
        "postgres_settings": result["postgres_settings"],
        "load_average_before": result["load_average_before"],
        "cpu_shares": {
            side: {
                name: (
                    run["server_cpu_share"],
                    run["postgres_cpu_share"],
                    round(run["generator_cpu_share"], 2),
                )
                for name, run in result[side].items()
            }
            for side in ("ceiling", "api")
        },
    }


if __name__ == "__main__":
    main()

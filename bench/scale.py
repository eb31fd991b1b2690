"""The operator at scale: N WebhookEndpoint resources on a real API server.

A throwaway control plane (hooklane/dev/controlplane.py) and Postgres, one
``hooklane operator`` process, N resources created with ``kubectl create``
(250 per call, as a platform onboarding its customers would; the smoke
preset 50 per call, each once the previous ones are stored), then:

- the time until every resource is stored in Postgres, and until every
  resource shows a status phase; then how long ``kubectl get
  webhookendpoints -A`` takes to print them all (its columns);
- idle, once nothing changes: the operator's RSS, its CPU over the idle
  window, and the API server's own count of writes (PATCH/UPDATE on
  webhookendpoints, from its /metrics) over the same window;
- the latency of one spec change reaching Postgres (several samples);
- with ``--stall-seconds``, the operator stopped that long halfway through
  the creation (the burst it then meets is what it holds afterwards);
- with ``--churn-seconds``, 1% of the resources changed per minute: the
  operator's CPU, RSS and own writes meanwhile;
- after a restart of the operator: how long until a change made at once
  reaches Postgres, until status that changed in Postgres while the
  operator was down shows on the resources, and its RSS and CPU once idle
  again; ``--restarts K`` measures K restarts, and ``--restart-tree`` (given
  twice or more) restarts into each tree in turn, side by side on the same
  resources.

``--tracemalloc FILE`` runs the operator under tracemalloc (six frames a
trace; it runs several times slower) and writes where its memory is at idle
(by file and by line) to FILE.
``--tree DIR`` runs the operator of another source tree (before/after).

    python -m bench.scale --preset 1k --json out.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    REPO,
    SECRET,
    fresh_database,
    machine,
    percentile,
    postgres_server,
    python_module,
    run_and_report,
)
from hooklane.crd import GROUP, PLURAL, VERSION
from hooklane.dev.controlplane import ControlPlane
from hooklane.spec import API_VERSION, KIND

NAMESPACE = "scale"
PER_CALL = 250
GROUP_PATH = f"/apis/{GROUP}/{VERSION}/namespaces/{NAMESPACE}/{PLURAL}"

PRESETS: dict[str, dict[str, Any]] = {
    # Created 50 at a time, each call once the operator has stored the
    # last: the memory test's figure without a backlog's peak in it.
    "smoke": {"resources": 500, "idle_seconds": 10, "changes": 3, "per_call": 50, "paced": True},
    "1k": {"resources": 1000, "idle_seconds": 30, "changes": 10},
    "5k": {"resources": 5000, "idle_seconds": 30, "changes": 10},
    "10k": {"resources": 10000, "idle_seconds": 30, "changes": 10},
}

# The operator under tracemalloc: SIGUSR1 writes where memory is.
_TRACED = """
import signal, sys, tracemalloc
tracemalloc.start(int(sys.argv.pop(1)))
out = sys.argv.pop(1)
def dump(signum, frame):
    snap = tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])
    with open(out, 'w') as f:
        for key in ('filename', 'lineno'):
            stats = snap.statistics(key)
            print(f'## by {key}: {sum(s.size for s in stats) / 1e6:.1f} MB traced', file=f)
            for s in stats[:40]:
                print(f'{s.size / 1e6:8.2f} MB {s.count:8d} blocks  {s.traceback}', file=f)
signal.signal(signal.SIGUSR1, dump)
from hooklane.cli import main
sys.exit(main(sys.argv[1:]))
"""


class Api:
    """The API server as the admin, straight over HTTPS (kubectl would cost
    a process and a full decode per call at 10,000 objects)."""

    def __init__(self, cp: ControlPlane) -> None:
        assert cp.dir is not None
        pki = cp.dir / "pki"
        self.server = cp.server
        self.ssl = ssl.create_default_context(cafile=str(pki / "ca.crt"))
        self.ssl.load_cert_chain(str(pki / "admin.crt"), str(pki / "admin.key"))

    def request(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(
            self.server + path, data=data, method=method, headers={"Content-Type": content_type}
        )
        with urllib.request.urlopen(req, context=self.ssl, timeout=60) as resp:
            raw = resp.read()
        return raw if path == "/metrics" else json.loads(raw)

    def phases(self) -> dict[str, str | None]:
        """name → status.phase of every resource, listed in pages."""
        found: dict[str, str | None] = {}
        token = ""
        while True:
            page = self.request("GET", f"{GROUP_PATH}?limit=2000&continue={token}")
            for item in page["items"]:
                found[item["metadata"]["name"]] = (item.get("status") or {}).get("phase")
            token = page["metadata"].get("continue") or ""
            if not token:
                return found

    def patch_spec(self, name: str, spec: dict[str, Any]) -> None:
        self.request("PATCH", f"{GROUP_PATH}/{name}", {"spec": spec}, "application/merge-patch+json")

    def writes(self) -> dict[str, float]:
        """apiserver_request_total for webhookendpoints by verb (writes only)."""
        text = self.request("GET", "/metrics").decode()
        counts: dict[str, float] = {}
        for line in text.splitlines():
            if not line.startswith("apiserver_request_total{") or f'resource="{PLURAL}"' not in line:
                continue
            verb = re.search(r'verb="([A-Z]+)"', line)
            if verb and verb.group(1) in ("PATCH", "UPDATE", "POST", "DELETE"):
                counts[verb.group(1)] = counts.get(verb.group(1), 0.0) + float(line.rsplit(" ", 1)[1])
        return counts


@dataclass
class Proc:
    proc: subprocess.Popen[bytes]
    log: Path

    def rss_mb(self) -> float:
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return float("nan")

    def cpu_seconds(self) -> float:
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def progress(what: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {what}", file=sys.stderr, flush=True)


def start_operator(
    cp: ControlPlane, dsn: str, log: Path, args: argparse.Namespace, *, traced: bool = False
) -> Proc:
    argv = ["operator", "--standalone", "--namespace", NAMESPACE]
    if traced:
        # PYTHONPATH below picks the tree.
        cmd = [sys.executable, "-c", _TRACED, "6", args.tracemalloc, *argv]
    else:
        cmd = python_module("hooklane.cli", *argv, tree=args.tree)
    env = {
        **os.environ,
        "KUBECONFIG": str(cp.kubeconfig),
        "HOOKLANE_DATABASE_URL": dsn,
        "HOOKLANE_OPERATOR_STATUS_SECONDS": str(args.status_seconds),
        "PYTHONPATH": str(args.tree or REPO),
    }
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, env=env, cwd=REPO, stdin=subprocess.DEVNULL, stdout=out, stderr=out)
    return Proc(proc, log)


def manifests(start: int, count: int) -> str:
    items = [
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "metadata": {"name": f"ep-{i:05d}"},
            "spec": {
                "url": f"https://customer-{i}.example.com/hooks",
                "tenant": f"tenant-{i % 50}",
                "secretRef": {"name": "signing", "key": "secret"},
                "maxConcurrency": 4,
            },
        }
        for i in range(start, start + count)
    ]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


async def _holds(check: Callable[[], Awaitable[bool]]) -> bool:
    # A loaded API server times out now and then: that is not an answer.
    try:
        return await check()
    except (TimeoutError, urllib.error.URLError):
        return False


async def wait_until(check: Callable[[], Awaitable[bool]], timeout: float, every: float = 0.05) -> float:
    """Seconds until ``check`` holds; raises after ``timeout``."""
    start = time.monotonic()
    while not await _holds(check):
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"not reached in {timeout:.0f} s")
        await asyncio.sleep(every)
    return time.monotonic() - start


async def change_latency(api: Api, db: asyncpg.Connection, name: str, tag: str, timeout: float) -> float:
    """Patch the resource's URL; seconds until Postgres holds it."""
    url = f"https://changed-{tag}.example.com/hooks"
    start = time.monotonic()
    await asyncio.to_thread(api.patch_spec, name, {"url": url})

    async def stored() -> bool:
        return await db.fetchval(
            "SELECT url = $3 FROM endpoints WHERE namespace = $1 AND name = $2", NAMESPACE, name, url
        )

    await wait_until(stored, timeout, every=0.02)
    return time.monotonic() - start


async def churn(api: Api, op: Proc, names: list[str], seconds: float) -> dict[str, Any]:
    """1% of the resources changed per minute, evenly spread, for
    ``seconds``: the operator's CPU and RSS meanwhile, and its own writes
    (the API server's PATCH count less this loop's spec patches)."""
    per_minute = max(1, len(names) // 100)
    writes0, cpu0, t0 = await asyncio.to_thread(api.writes), op.cpu_seconds(), time.monotonic()
    changed = 0
    while time.monotonic() - t0 < seconds:
        name = random.choice(names)
        await asyncio.to_thread(api.patch_spec, name, {"maxConcurrency": 1 + changed % 8})
        changed += 1
        await asyncio.sleep(max(0.0, t0 + changed * 60 / per_minute - time.monotonic()))
    writes1, cpu1, t1 = await asyncio.to_thread(api.writes), op.cpu_seconds(), time.monotonic()
    elapsed = t1 - t0
    patches = writes1.get("PATCH", 0) - writes0.get("PATCH", 0) - changed
    return {
        "changes_per_minute": per_minute,
        "changes": changed,
        "rss_mb": op.rss_mb(),
        "cpu_cores": (cpu1 - cpu0) / elapsed,
        "operator_patches_per_second": patches / elapsed,
    }


def idle_window(args: argparse.Namespace) -> float:
    """Seconds over which idle RSS, CPU and writes are measured."""
    return float(args.idle_seconds or PRESETS[args.preset]["idle_seconds"])


async def stalled(op: Proc, seconds: float) -> None:
    """The operator stopped (SIGSTOP) for ``seconds``, as a busy node or a
    long pause would stop it, while the creation goes on."""
    op.proc.send_signal(signal.SIGSTOP)
    try:
        await asyncio.sleep(seconds)
    finally:
        op.proc.send_signal(signal.SIGCONT)


async def measure_restart(
    args: argparse.Namespace,
    api: Api,
    db: asyncpg.Connection,
    op: Proc,
    names: list[str],
    changed: list[str],
    restarted: float,
    into: dict[str, Any],
    turn: int,
) -> None:
    into["first_change_seconds"] = await change_latency(api, db, names[-1], f"restart-{turn}", args.timeout)
    into["first_change_from_start_seconds"] = time.monotonic() - restarted
    progress("first change after restart stored")

    async def reflected() -> bool:
        phases = await asyncio.to_thread(api.phases)
        return all(phases.get(name) == "Deactivated" for name in changed)

    await wait_until(reflected, args.timeout, every=1)
    into["status_current_seconds"] = time.monotonic() - restarted
    # What a restarted operator holds once idle: its start met every
    # resource at once, not one creation at a time.
    await asyncio.sleep(max(2 * args.status_seconds, 5))
    cpu0, t0 = op.cpu_seconds(), time.monotonic()
    await asyncio.sleep(idle_window(args))
    into["idle_rss_mb"] = op.rss_mb()
    into["idle_cpu_cores"] = (op.cpu_seconds() - cpu0) / (time.monotonic() - t0)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    preset = PRESETS[args.preset]
    n = args.resources or preset["resources"]
    idle_seconds = idle_window(args)
    result: dict[str, Any] = {
        "config": {
            "preset": args.preset,
            "resources": n,
            "idle_seconds": idle_seconds,
            "status_seconds": args.status_seconds,
            "stall_seconds": args.stall_seconds,
            "tree": str(args.tree or REPO),
        },
        "machine": {**machine(), "load_at_start": os.getloadavg()},
    }
    logdir = Path(args.log_dir)
    await asyncio.to_thread(logdir.mkdir, parents=True, exist_ok=True)
    with postgres_server(args.dsn) as server, ControlPlane() as cp:
        api = Api(cp)
        cp.create_namespace(NAMESPACE)
        cp.kubectl(
            "-n", NAMESPACE, "create", "secret", "generic", "signing", f"--from-literal=secret={SECRET}"
        )
        async with fresh_database(server, "scale") as dsn:
            db = await asyncpg.connect(dsn)
            op = start_operator(cp, dsn, logdir / "operator.log", args, traced=bool(args.tracemalloc))
            try:
                await asyncio.sleep(3)
                result["rss_empty_mb"] = op.rss_mb()

                # Creation, 250 per kubectl call, as fast as kubectl goes.
                start = time.monotonic()
                per_call = preset.get("per_call", PER_CALL)

                def stored(count: int) -> Callable[[], Awaitable[bool]]:
                    async def check() -> bool:
                        found = await db.fetchval(
                            "SELECT count(*) FROM endpoints WHERE namespace = $1", NAMESPACE
                        )
                        return bool(found >= count)

                    return check

                stall: asyncio.Task[None] | None = None
                for first in range(0, n, per_call):
                    count = min(per_call, n - first)
                    if args.stall_seconds and stall is None and first >= n // 2:
                        stall = asyncio.create_task(stalled(op, args.stall_seconds))
                    await asyncio.to_thread(
                        cp.kubectl, "-n", NAMESPACE, "create", "-f", "-", stdin=manifests(first, count)
                    )
                    if preset.get("paced"):
                        await wait_until(stored(first + count), args.timeout, every=0.1)
                result["create_seconds"] = time.monotonic() - start
                if stall is not None:
                    await stall
                await wait_until(stored(n), args.timeout, every=0.5)
                result["sync_all_seconds"] = time.monotonic() - start
                progress("all stored")
                result["rss_after_sync_mb"] = op.rss_mb()

                async def all_status() -> bool:
                    phases = await asyncio.to_thread(api.phases)
                    return sum(1 for p in phases.values() if p) >= n

                await wait_until(all_status, args.timeout, every=2)
                result["status_all_seconds"] = time.monotonic() - start
                progress("all have status")
                listed_at = time.monotonic()
                listed = await asyncio.to_thread(cp.kubectl, "get", "webhookendpoints", "-A", "--no-headers")
                result["kubectl_get_all"] = {
                    "seconds": time.monotonic() - listed_at,
                    "rows": len(listed.stdout.splitlines()),
                }

                # Idle: nothing changes anywhere.
                await asyncio.sleep(max(2 * args.status_seconds, 5))
                writes0, cpu0, t0 = await asyncio.to_thread(api.writes), op.cpu_seconds(), time.monotonic()
                await asyncio.sleep(idle_seconds)
                writes1, cpu1, t1 = await asyncio.to_thread(api.writes), op.cpu_seconds(), time.monotonic()
                result["idle"] = {
                    "rss_mb": op.rss_mb(),
                    "cpu_cores": (cpu1 - cpu0) / (t1 - t0),
                    "writes_per_second": {
                        v: (writes1.get(v, 0) - writes0.get(v, 0)) / (t1 - t0) for v in writes1
                    },
                }
                result["idle"]["kb_per_resource"] = (
                    (result["idle"]["rss_mb"] - result["rss_empty_mb"]) * 1024 / n
                )
                progress("idle measured")
                if args.tracemalloc:
                    op.proc.send_signal(signal.SIGUSR1)
                    await asyncio.sleep(20)

                # One change at a time, each to a random resource.
                names = [f"ep-{i:05d}" for i in range(n)]
                latencies = [
                    await change_latency(api, db, random.choice(names), f"idle-{i}", args.timeout)
                    for i in range(preset["changes"])
                ]
                result["change_seconds"] = {
                    "p50": percentile(latencies, 50),
                    "p99": percentile(latencies, 99),
                    "max": max(latencies),
                }
                if args.churn_seconds:
                    result["churn"] = await churn(api, op, names, args.churn_seconds)
                    progress("churn measured")

                # Restarts: status changes in Postgres meanwhile, then a change
                # is made the moment the new operator starts; with
                # --restart-tree, the trees take turns on the same resources.
                trees = args.restart_tree or [args.tree]
                result["restarts"] = []
                for turn in range(args.restarts * len(trees)):
                    op.stop()
                    args.tree = trees[turn % len(trees)]
                    changed = random.sample(names, min(20, n))
                    await db.execute(
                        "UPDATE endpoints SET state = 'deactivated', deactivated_at = now(), "
                        "deactivated_reason = 'bench' WHERE namespace = $1 AND name = ANY($2)",
                        NAMESPACE,
                        changed,
                    )
                    restarted = time.monotonic()
                    op = start_operator(cp, dsn, logdir / "operator.log", args)
                    restart: dict[str, Any] = {"tree": str(args.tree or REPO)}
                    result["restarts"].append(restart)
                    try:
                        await measure_restart(args, api, db, op, names, changed, restarted, restart, turn)
                    except TimeoutError:
                        # A restart that never serves a change is a result too.
                        restart["timed_out_after_seconds"] = args.timeout
                    await db.execute(
                        "UPDATE endpoints SET state = 'active', deactivated_at = NULL, "
                        "deactivated_reason = NULL WHERE namespace = $1 AND name = ANY($2)",
                        NAMESPACE,
                        changed,
                    )
                if result["restarts"]:
                    result["restart"] = result["restarts"][0]
                result["machine"]["load_at_end"] = os.getloadavg()
            finally:
                op.stop()
                await db.close()
    return result


def brief(result: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in result.items() if k != "machine"}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--preset", choices=PRESETS, default="smoke")
    parser.add_argument("--resources", type=int, help="override the preset's number of resources")
    parser.add_argument("--idle-seconds", type=float)
    parser.add_argument("--status-seconds", type=float, default=10.0, help="HOOKLANE_OPERATOR_STATUS_SECONDS")
    parser.add_argument("--timeout", type=float, default=900.0, help="for each wait")
    parser.add_argument(
        "--churn-seconds",
        type=float,
        default=0.0,
        help="after the idle window, change 1%% of the resources per minute for this long",
    )
    parser.add_argument(
        "--dsn", help="a Postgres server to create the database on (default: a throwaway one)"
    )
    parser.add_argument(
        "--stall-seconds",
        type=float,
        default=0.0,
        help="stop the operator (SIGSTOP) this long once half the resources are created",
    )
    parser.add_argument("--tree", type=Path, help="run the operator of this source tree")
    parser.add_argument("--restarts", type=int, default=1, help="restarts measured (per restart tree)")
    parser.add_argument(
        "--restart-tree",
        type=Path,
        action="append",
        help="restart into this tree (repeat it: the trees take turns, side by side on the same resources)",
    )
    parser.add_argument(
        "--tracemalloc", metavar="FILE", help="profile the operator's memory at idle into FILE"
    )
    parser.add_argument("--log-dir", default="/tmp/hooklane-bench-scale")
    parser.add_argument("--json")
    run_and_report(run, parser.parse_args(), brief)


if __name__ == "__main__":
    main()

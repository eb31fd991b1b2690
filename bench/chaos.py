"""Chaos runs (issue 7), long: workers killed and drained, PostgreSQL
restarted fast and immediate, backends terminated, hostile receivers; each
run checks for its whole length that nothing was lost and no endpoint went
over its maxConcurrency (the harness is testsupport/chaos.py, shared with
tests/processes/test_chaos.py, which runs short versions in CI).

Run: ``python -m bench.chaos --scenario all`` (about 20 minutes); results in
docs/bench-results/chaos-<scenario>.json, a table on stdout, and the exit
status is 1 if any run broke an invariant or lost a worker. What the figures
mean: docs/reliability.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench.common import DOCS, machine, write_json
from testsupport.chaos import (
    HOSTILE_WORKER_ENV,
    Report,
    Scenario,
    format_report,
    local_postgres,
    run_scenario,
)

SCENARIOS = ("kill", "term", "pg-fast", "pg-immediate", "terminate", "hostile")
# --scenario pg-restart is both restart modes, one run of each per --runs.
ALIASES = {"pg-restart": ("pg-fast", "pg-immediate"), "all": SCENARIOS}

# The long versions: (faults of the run, workers, publish rate per second,
# seconds of publishing at least). The issue asks for 20 restarts in a row.
DEFAULTS: dict[str, tuple[tuple[str, ...], int, float, float]] = {
    "kill": (("kill",) * 10, 3, 50.0, 60.0),
    "term": (("term",) * 10, 3, 50.0, 60.0),
    "pg-fast": (("pg-fast",) * 20, 2, 50.0, 60.0),
    "pg-immediate": (("pg-immediate",) * 20, 2, 50.0, 60.0),
    "terminate": (("terminate",) * 30, 2, 50.0, 60.0),
    # A third of each tenant's events go to the hostile endpoints as well;
    # at 12/s every hostile delivery reaches its end within the run.
    "hostile": ((), 2, 12.0, 120.0),
}


def scenario(name: str, args: argparse.Namespace, run: int) -> Scenario:
    faults, workers, rate, duration = DEFAULTS[name]
    if args.faults is not None and faults:
        faults = (faults[0],) * args.faults
    s = Scenario(
        name,
        faults,
        workers=args.workers or workers,
        rate=args.rate or rate,
        duration=args.duration or duration,
        gap=tuple(args.gap),
        seed=None if args.seed is None else args.seed + run,
    )
    if name == "hostile":
        from testsupport.hostile import HostileServer

        s = replace(s, hostile_modes=tuple(HostileServer.MODES), worker_env=HOSTILE_WORKER_ENV)
    return s


async def run_all(names: Sequence[str], args: argparse.Namespace) -> dict[str, list[Report]]:
    """Every run on one durable LocalPostgres, each in a database of its
    own."""
    reports: dict[str, list[Report]] = {name: [] for name in names}
    with local_postgres() as pg:
        for name in names:
            for run in range(args.runs):
                logdir = Path(args.keep_logs) / f"{name}-{run}" if args.keep_logs else None
                if logdir:
                    logdir.mkdir(parents=True, exist_ok=True)
                started = time.monotonic()
                report = await run_scenario(scenario(name, args, run), pg, logdir)
                reports[name].append(report)
                print(format_report(report), file=sys.stderr, flush=True)
                print(f"  ({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
    return reports


def summarise(reports: Sequence[Report]) -> dict[str, Any]:
    """One scenario's runs in a row of figures."""
    faults = [f for r in reports for f in r.faults]
    recover = sorted(f["recover_s"] for f in faults if f["recover_s"] is not None)
    drain = sorted(f["drain_s"] for f in faults if f["drain_s"] is not None)
    settled = sorted(f["settled_s"] for f in faults if f["settled_s"] is not None)
    took = sorted(f["took_s"] for f in faults)
    memory = [r.memory for r in reports if r.memory]
    return {
        "runs": len(reports),
        "ok_runs": sum(r.ok for r in reports),
        "faults": len(faults),
        "events": sum(r.events for r in reports),
        "deliveries_owed": sum(r.deliveries_owed for r in reports),
        "received": sum(r.received for r in reports),
        "dead": sum(r.dead for r in reports),
        "lost": sum(r.lost for r in reports),
        "duplicates": sum(r.duplicates for r in reports),
        "limit_exceeded": [x for r in reports for x in r.limit_exceeded],
        "peak_vs_limit": _peaks(reports),
        "worker_deaths": sum(len(r.worker_failures) for r in reports),
        "fault_took_s": _stats(took),
        "recover_s": _stats(recover),
        "drain_s": _stats(drain),
        "settled_s": _stats(settled),
        "worker_rss_mib": {
            "start": max((m["start_mib"] for m in memory), default=None),
            "peak": max((m["peak_mib"] for m in memory), default=None),
            "end": max((m["end_mib"] for m in memory if m.get("end_mib")), default=None),
        },
        "latency_ms_p99": max((r.latency_ms.get("p99", 0) for r in reports), default=None),
        "hostile": _hostile(reports),
        "problems": [p for r in reports for p in r.problems],
    }


def _peaks(reports: Sequence[Report]) -> dict[str, str]:
    names = {n for r in reports for n in r.peaks}
    return {
        n: f"{max(r.peaks[n]['peak'] for r in reports if n in r.peaks)}/"
        f"{max(r.peaks[n]['limit'] for r in reports if n in r.peaks)}"
        for n in sorted(names)
    }


def _hostile(reports: Sequence[Report]) -> dict[str, int] | None:
    outcomes: dict[str, int] = {}
    for r in reports:
        for k, v in (r.hostile.get("outcomes") or {}).items():
            outcomes[k] = outcomes.get(k, 0) + v
    return outcomes or None


def _stats(values: Sequence[float]) -> dict[str, float]:
    if not values:
        return {}
    return {"p50": round(values[len(values) // 2], 3), "max": round(values[-1], 3)}


def table(summaries: dict[str, dict[str, Any]]) -> str:
    head = (
        "scenario",
        "runs ok",
        "faults",
        "events",
        "owed",
        "lost",
        "dead",
        "dup",
        "in flight",
        "recover p50/max s",
        "drain p50/max s",
        "settled p50/max s",
        "RSS start/peak/end MiB",
        "worker deaths",
    )
    rows = [head]
    for name, s in summaries.items():
        rss = s["worker_rss_mib"]
        rows.append(
            (
                name,
                f"{s['ok_runs']}/{s['runs']}",
                str(s["faults"]),
                str(s["events"]),
                str(s["deliveries_owed"]),
                str(s["lost"]),
                str(s["dead"]),
                str(s["duplicates"]),
                _limits(s),
                _pair(s["recover_s"]),
                _pair(s["drain_s"]),
                _pair(s["settled_s"]),
                f"{rss['start']}/{rss['peak']}/{rss['end']}",
                str(s["worker_deaths"]),
            )
        )
    widths = [max(len(r[i]) for r in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=False)) for r in rows)


def _limits(s: dict[str, Any]) -> str:
    """'held, 4/5 at limit': no peak above its limit, and how many endpoints
    ran full at some point (a limit never reached tests nothing)."""
    peaks = [tuple(map(int, v.split("/"))) for v in s["peak_vs_limit"].values()]
    at_limit = sum(p == limit for p, limit in peaks)
    verdict = "EXCEEDED" if s["limit_exceeded"] else "held"
    return f"{verdict}, {at_limit}/{len(peaks)} at limit"


def _pair(stats: dict[str, float]) -> str:
    return f"{stats['p50']}/{stats['max']}" if stats else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="chaos runs: faults under load, nothing lost, limits exact")
    parser.add_argument("--scenario", choices=[*SCENARIOS, *ALIASES], default="all")
    parser.add_argument("--runs", type=int, default=1, help="runs of each scenario (fresh database each)")
    parser.add_argument(
        "--faults", type=int, help="faults per run (default: 10 kills/terms, 20 restarts, 30 terminations)"
    )
    parser.add_argument("--duration", type=float, help="seconds of publishing per run, at least")
    parser.add_argument("--rate", type=float, help="events published per second")
    parser.add_argument("--workers", type=int, help="worker processes")
    parser.add_argument(
        "--gap",
        type=float,
        nargs=2,
        default=(0.5, 3.0),
        metavar=("MIN", "MAX"),
        help="seconds between a fault's recovery and the next fault",
    )
    parser.add_argument("--seed", type=int, help="seed of the first run (the next runs add 1 each)")
    parser.add_argument(
        "--json-dir",
        default=str(DOCS / "bench-results"),
        help="where chaos-<scenario>.json goes ('' for nowhere)",
    )
    parser.add_argument("--keep-logs", help="keep each worker's log under this folder")
    args = parser.parse_args(argv)
    names = ALIASES.get(args.scenario, (args.scenario,))
    reports = asyncio.run(run_all(names, args))
    summaries = {name: summarise(rs) for name, rs in reports.items()}
    about = machine()
    if args.json_dir:
        for name, rs in reports.items():
            write_json(
                str(Path(args.json_dir) / f"chaos-{name}.json"),
                {
                    "scenario": name,
                    "argv": sys.argv[1:],
                    "machine": about,
                    "summary": summaries[name],
                    "runs": [r.to_dict() for r in rs],
                },
            )
    print(table(summaries))
    print(json.dumps({n: s["problems"] for n, s in summaries.items() if s["problems"]}, indent=1))
    return 0 if all(r.ok for rs in reports.values() for r in rs) else 1


if __name__ == "__main__":
    sys.exit(main())

"""Each benchmark's smoke preset, run as the README runs it (a subprocess),
so that bench/ cannot rot. A few seconds each, on the session's Postgres."""

from __future__ import annotations

import importlib.util
import subprocess
from pathlib import Path

import pytest

from testsupport.bench_smoke import REPO, run_bench


def test_incident_smoke(server_dsn: str, tmp_path: Path) -> None:
    plots = str(tmp_path) if importlib.util.find_spec("matplotlib") else ""
    result = run_bench("incident", tmp_path, "--dsn", server_dsn, "--plot-dir", plots)
    runs = {r["system"]: r for r in result["runs"]}
    assert runs["hooklane"]["healthy_delivered"] > 0
    assert runs["baseline"]["healthy_delivered"] > 0
    # The one property that holds even for a few seconds of load.
    assert runs["hooklane"]["slow_peak_in_flight"] <= result["config"]["max_concurrency"]
    if plots:
        assert (tmp_path / "incident-smoke-16.png").stat().st_size > 0


def test_incident_ordered_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("incident", tmp_path, "--dsn", server_dsn, "--ordered-keys", "3", "--plot-dir", "")
    assert [(r["system"], r["ordered_keys"]) for r in result["runs"]] == [("hooklane", 0), ("hooklane", 3)]
    for run in result["runs"]:
        assert run["healthy_delivered"] > 0
        assert run["slow_peak_in_flight"] <= result["config"]["max_concurrency"]
    [verdict] = result["verdict"].values()
    assert verdict["ordered_keys"] == 3
    assert verdict["ordered_p99"] > 0 and verdict["unordered_p99"] > 0


def test_ordering_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("ordering", tmp_path, "--dsn", server_dsn, timeout=150)
    runs = {run["keys"]: run for run in result["runs"]}
    assert set(runs) == {0, *result["config"]["keys"]}
    # Only that every run measured something: one key's throughput is one
    # delivery at a time, and how far it gets in a few seconds is the
    # machine's (section 20 of docs/benchmarks.md).
    for keys, run in runs.items():
        assert run["delivered"] > 0 and run["pg_publishing_ms_per_event"] > 0
        order = run["order"]
        assert order["violations"] == 0 and order["half_headers"] == 0, order
        if keys:
            # Every call of an ordered run carried its key and sequence, one
            # call of a key at a time, and every key was seen.
            assert order["sequenced_calls"] == run["calls"]
            assert order["keys_seen"] == keys
            assert run["receiver_key_peak_open"] == 1
        else:
            assert order["sequenced_calls"] == 0 and run["receiver_key_peak_open"] == 0
            assert run["delivered"] == run["published"] and run["latency_ms"]["n"] > 0
    assert [row["variant"] for row in result["summary"]] == ["unordered", "1 key", "10 keys"]
    assert all(set(row["over_unordered"]) >= {"del/s", "pg ms/del"} for row in result["summary"][1:])


def test_incident_adaptive_smoke(server_dsn: str, tmp_path: Path) -> None:
    plots = str(tmp_path) if importlib.util.find_spec("matplotlib") else ""
    result = run_bench(
        "incident", tmp_path, "--dsn", server_dsn, "--adaptive", "--duration", "2", "--plot-dir", plots
    )
    today, adaptive = result["runs"]
    assert [r["config"]["busy_adaptive"] for r in result["runs"]] == [False, True]
    assert adaptive["config"]["busy_retry_after"] > 0
    for run in result["runs"]:
        assert run["system"] == "hooklane" and run["healthy_delivered"] > 0
        busy = run["busy"]
        # More than it takes is sent to it, so some calls are refused, and
        # never more than it takes are open at once.
        assert busy["refused_429"] > 0 and busy["delivered"] > 0
        assert busy["receiver_peak_open"] <= result["config"]["busy_open"]
        assert busy["at_end"]["attempts"]["retry"] > 0
    # Today's limit stays maxConcurrency; the adaptive one came down, and a
    # Retry-After held it.
    assert today["busy"]["limit"]["min"] == result["config"]["busy_max_concurrency"]
    assert adaptive["busy"]["limit"]["min"] < result["config"]["busy_max_concurrency"]
    assert adaptive["busy"]["held_share"] > 0 == today["busy"]["held_share"]
    assert [v["busy"] for v in result["verdict"]] == [
        "not adaptive, no Retry-After",
        "adaptive, Retry-After 1 s",
    ]
    if plots:
        assert (tmp_path / "incident-adaptive-smoke.png").stat().st_size > 0


def test_incident_correlated_smoke(server_dsn: str, tmp_path: Path) -> None:
    # --before-tree this same tree: the two-worker path (a tree's migrations,
    # endpoints and worker) runs too; a setting no worker knows is passed
    # through and ignored.
    plots = str(tmp_path) if importlib.util.find_spec("matplotlib") else ""
    result = run_bench(
        "incident",
        tmp_path,
        *("--dsn", server_dsn, "--correlated", "--before-tree", str(REPO)),
        *("--worker-setting", "WORKER_LONG_CALLS=64", "--plot-dir", plots),
        timeout=150,
    )
    assert [r["worker"] for r in result["runs"]] == ["before", "after"]
    names = [p["name"] for p in result["phases"]]
    for run in result["runs"]:
        assert run["settings"] == {"WORKER_LONG_CALLS": "64"} and run["fair_budget"] == 64
        assert [p["phase"] for p in run["phases"]] == names
        for phase in run["phases"]:
            assert phase["healthy_delivered"] > 0
            assert phase["healthy_delivered"] + phase["healthy_undelivered"] == phase["healthy_published"]
            assert phase["healthy_lag"]["p99"] > 0
            assert phase["worker_rss_mb"]["mean"] > 0 and phase["worker_fds"]["mean"] > 0
        by_name = {p["phase"]: p for p in run["phases"]}
        # Each phase's events reached the endpoints it made slow or hanging.
        assert by_name["90% slow"]["calls_by_class"]["slow"] > 0
        assert by_name["10% hanging"]["calls_by_class"]["hang"] > 0
        assert by_name["one tenant's endpoints slow"]["slow_endpoints"] == result["config"]["big_tenant"]
        assert by_name["self-service endpoint at the bounds"]["calls_by_class"]["self"] > 0
        end = run["at_end"]
        assert end["nothing_lost"] and end["dead"] == 0 and end["discarded"] == 0, end
    assert "| 90% slow | after |" in result["table"]
    if plots:
        assert (tmp_path / "incident-correlated-smoke.png").stat().st_size > 0


def test_rate_limit_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("rate_limit", tmp_path, "--dsn", server_dsn, timeout=120)
    for case in result["limits"]["cases"]:
        assert case["calls_in_window"] > 0
        # A second of a few calls, more or less one call's jitter: not a
        # measurement, only that the limit is what holds the calls back.
        assert 0.5 < case["achieved_over_limit"] < 1.3, case
        assert case["most_in_1s_run"] <= 2 * case["bound_in_1s"], case
    assert result["limits"]["bucket_index"]["entries"] > 0
    ways = [row["tree"] for row in result["cost"]["summary"] if "median" in row]
    assert ways == ["(i) no limit, published", "(ii) rateLimit, backlog", "(iii) rateLimit, published"]
    for run in result["cost"]["runs"]:
        assert run["deliveries_in_window"] > 0
        assert run["cpu_ms_per_delivery"]["postgres"] > 0
        assert run["delivered"] == run["published"]
    ratios = [row for row in result["cost"]["summary"] if "ratio" in row]
    assert len(ratios) == 2 and all(r["ratio"]["total ms/del"] > 0 for r in ratios)


def test_throughput_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("throughput", tmp_path, "--dsn", server_dsn)
    assert result["drains"][0]["delivered"] == result["config"]["backlog"]
    assert result["ceiling"][0]["per_second"] > 0
    assert result["verdict"]["peak_rss_mb"] > 0


def test_latency_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("latency", tmp_path, "--dsn", server_dsn)
    assert result["latency_ms"]["n"] == result["config"]["events"]


def test_steady_smoke(server_dsn: str, tmp_path: Path) -> None:
    # --compare with this same tree: the two-tree path (migrations, worker and
    # publisher started from a given tree, interleaving, ratios) runs too;
    # --traced, the same again with every delivery traced and exported.
    result = run_bench(
        "steady", tmp_path, "--dsn", server_dsn, "--compare", str(REPO), "--traced", timeout=180
    )
    assert len(result["trees"]) == 3 and result["trees"][2].endswith(" traced")
    assert {r["tree"] for r in result["runs"]} == set(result["trees"])
    for run in result["runs"]:
        traced = run["tree"].endswith(" traced")
        # a span per attempt at least, and none at all untraced
        assert (run["spans_exported"] >= run["published"]) if traced else run["spans_exported"] == 0
    for run in result["runs"]:
        assert run["published"] == result["config"]["rates"][0] * (
            result["config"]["warmup"] + result["config"]["seconds"] + result["config"]["tail"]
        )
        assert run["delivered"] == run["published"]
        assert run["deliveries_in_window"] > 0
        assert run["cpu_ms_per_delivery"]["postgres"] > 0
        assert run["reservation_rounds_per_s"] > 0
        assert run["latency_ms"]["n"] > 0
        assert run["hooklane"] == str(REPO / "hooklane" / "__init__.py")
    ratios = [row for row in result["summary"] if "ratio" in row]
    assert len(ratios) == 2 and all(r["ratio"]["del/s"] > 0 for r in ratios)


def test_held_xmin_smoke(server_dsn: str, tmp_path: Path) -> None:
    # Shorter than the preset: two buckets a phase is all the path needs.
    phases = ("--control-seconds", "6", "--held-seconds", "6", "--bucket", "3")
    result = run_bench("held_xmin", tmp_path, "--dsn", server_dsn, *phases, timeout=120)
    [run] = result["runs"]
    assert run["hooklane"] == str(REPO / "hooklane" / "__init__.py")
    assert run["delivered"] == run["published"] > 0
    held = run["held_session"]
    assert held["start"]["backend_xmin"] is not None
    assert held["end"]["backend_xmin"] == held["start"]["backend_xmin"]
    assert [b["phase"] for b in run["buckets"]] == ["control"] * 2 + ["held"] * 2
    for bucket in run["buckets"]:
        assert bucket["deliveries"] > 0
        assert bucket["pg_ms_per_delivery"] > 0
        assert bucket["latency_ms"]["n"] > 0
        assert bucket["ratio"]["p99"] > 0
    assert {"deliveries", "events"} <= {t["relname"] for t in run["tables"]["held_end"]}
    assert set(result["verdict"][run["tree"]]["within_target"]) == {"pg_ms_per_delivery", "p99"}


def test_held_xmin_reads_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("held_xmin", tmp_path, "--dsn", server_dsn, "--reads")
    before, *held = result["rows"]
    assert [r["sent_while_held"] for r in held] == [2000, 4000]
    # The gauges as they read before walk the dead entries sent while held;
    # as the gauge job reads now, they stay where they were before the hold.
    assert held[-1]["gauges_before"]["buffers"] > before["gauges_before"]["buffers"]
    assert held[-1]["gauges_after"]["buffers"] <= 2 * before["gauges_after"]["buffers"]
    # So do the listing and the totals from a gauge pass's counts, where
    # counting the queues themselves walks them.
    for read in ("listing", "totals"):
        assert held[-1][f"{read}_before"]["buffers"] > 2 * before[f"{read}_before"]["buffers"]
        assert held[-1][f"{read}_after"]["buffers"] <= 2 * before[f"{read}_after"]["buffers"]


def test_reservation_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench(
        "reservation",
        tmp_path,
        "--dsn",
        server_dsn,
        "--finished",
        "20000",
        "--rate-limited",
        "100",
        "--versions",
    )
    assert [s["endpoints"] for s in result["sizes"]] == list(result["config"]["sizes"])
    timed = result["sizes"] + result["with_finished"] + result["rate_limited"]
    assert all(s["reserved"] > 0 for s in timed)
    # a ceiling above the tenant's calls in flight reserves as reserve
    # does; a ceiling below them, nothing
    for s in timed:
        v = s["versions"]
        assert v["ceiling_above"]["reserved"] == s["reserved"]
        assert v["ceiling_held"]["reserved"] == 0
    assert (
        len(result["finished_over_none"])
        == len(result["rate_limited_over_unlimited"])
        == len(result["sizes"])
    )


def test_fanout_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("fanout", tmp_path, "--dsn", server_dsn)
    endpoints = result["config"]["endpoints"]
    for state in ("stale", "fresh"):
        assert result[state]["fanout"] == [endpoints]
        assert result[state]["most_rows_in_one_node"] == endpoints
    assert result["stale"]["reltuples"] < 0 < result["fresh"]["reltuples"]


def test_ingest_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("ingest", tmp_path, "--dsn", server_dsn, timeout=120)
    assert result["postgres_settings"]["synchronous_commit"] == "on"
    for side in ("api", "ceiling"):
        for run in result[side].values():
            assert run["events"] > 0
            assert set(run["statuses"]) == {"202"}
    assert result["api"]["rate"]["latency_ms"]["n"] > 0
    # Each 202 means committed: the database holds every event acknowledged.
    assert result["stored"] == result["acknowledged"] > 0
    assert result["summary"]["every_202_stored"]


def test_publish_function_smoke(server_dsn: str, tmp_path: Path) -> None:
    # Today's path is the statements and the API of an earlier commit.
    before = "39e890d"
    if subprocess.run(["git", "-C", str(REPO), "cat-file", "-e", f"{before}^{{commit}}"]).returncode:
        pytest.fail(f"{before} is not in this checkout's history (a shallow clone?): `git fetch --unshallow`")
    result = run_bench("publish_function", tmp_path, "--dsn", server_dsn, "--before", before, timeout=120)
    direct = result["direct"]
    workloads = {run["workload"] for run in direct["runs"]}
    assert len(workloads) == 2 * len(result["config"]["sizes"])
    for run in direct["runs"]:
        # Every event committed was stored (the bench counts them).
        assert run["events_in_window"] > 0 and run["stored"] >= run["events_in_window"]
        assert run["postgres_ms_per_event"] > 0
    ratios = [row for row in direct["summary"] if "ratio" in row]
    assert len(ratios) == len(workloads) and all(r["ratio"]["events_per_s"] > 0 for r in ratios)
    for size in result["checks"]:
        assert size["data_text_bytes"] >= size["json_bytes"] > 0
        assert set(size["us_per_event"]) >= {"hooklane_publish_refusal_v1, all"}
    runs = result["ingest"]["runs"]
    assert {run["path"] for run in runs} == {"today", "function"}
    assert all(run["events_per_s"] > 0 and run["postgres_ms_per_event"] > 0 for run in runs)
    assert {v["part"] for v in result["verdict"]} == {"direct", "ingest"}


def test_catalogue_publish_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("catalogue_publish", tmp_path, "--dsn", server_dsn, timeout=180)
    runs = result["runs"]
    assert {(r["setup"], r["path"]) for r in runs} == {
        (setup, path) for setup in ("main", "off", "enforce") for path in ("sql", "library", "api")
    }
    for run in runs:
        assert run["p99_ms"] >= run["p50_ms"] > 0 and run["postgres_us_per_event"] >= 0
        # Only under enforce was each event validated (and stored with its version).
        assert run["validated"] == (
            run["events"] + result["config"]["warmup"] if run["setup"] == "enforce" else 0
        )
    assert result["validator"]["cached_us_per_call"] > 0
    assert [row["setup"] for row in result["function"]] == ["main", "off", "enforce"]
    assert all(row["median_us"] > 0 for row in result["function"])
    assert {row["setup"] for row in result["summary"] if "over_main" in row} == {"off", "enforce"}


def test_tenants_smoke(server_dsn: str, tmp_path: Path) -> None:
    result = run_bench("tenants", tmp_path, "--dsn", server_dsn, timeout=120)
    sizes = [f"{n:,}" for n in result["config"]["sizes"]]
    summary = result["api"]["summary"]
    assert {(s["size"], s["listing"]) for s in summary} == {
        (size, listing) for size in sizes for listing in ("deliveries", "endpoints")
    }
    for s in summary:
        # The same listing both ways: the same answer (the endpoints' ages
        # move between requests), and a cost each.
        assert abs(s["admin"]["bytes"] - s["tenant"]["bytes"]) <= s["admin"]["bytes"] / 100, s
        assert s["admin"]["postgres_ms_per_request"] > 0 and s["tenant"]["postgres_ms_per_request"] > 0
    assert {(p["size"], p["tenant"]) for p in result["portal"]["pages"]} == {
        (size, tenant) for size in sizes for tenant in ("t1", "big")
    }
    # Every pass noted and published what its state made (the bench checks
    # each), in every state and database.
    passes = result["notifications"]["summary"]
    assert {p["state"] for p in passes} == {"steady", "openings", "dead", "all_open"}
    assert len(passes) == 4 * len(result["databases"])
    assert all(p["ms"] > 0 for p in passes)
    openings = [p for p in passes if p["state"] == "openings"]
    assert all(p["published"] == result["config"]["openings"] for p in openings)
    for size in sizes:
        assert (
            result["notifications"]["all_open_circuits"][size] == result["databases"][size]["endpoints"] - 1
        )
        assert result["notifications"]["plans"]["all_open"][size]["note_notices"]["top_scans"]

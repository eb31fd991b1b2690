"""The charts of an endpoint's page (issue 41) over real HTTP on a real
Postgres: drawn from the attempts a real worker recorded against a real
receiver, or from rows written as the worker writes them, in the
dashboard and the portal alike. The drawing itself: tests/unit; in a
browser: tests/browser/test_endpoint_charts.py."""

from __future__ import annotations

import html
import re
import statistics
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import asyncpg
import pytest
from aiohttp.test_utils import TestClient

from hooklane import charts
from hooklane.api.auth import PORTAL_COOKIE
from hooklane.settings import Settings
from hooklane.store.queries import QUERIES
from testsupport.api import ADMIN, ADMIN_AUTH, INGEST, NOWHERE, grant
from testsupport.attempts import record_attempts
from testsupport.fixtures import add_endpoint, flaky_history, in_process_api
from testsupport.receivers import Receiver


@pytest.fixture
async def api(dsn: str, settings: Settings) -> AsyncIterator[TestClient]:  # type: ignore[type-arg]
    async with in_process_api(dsn, replace(settings, portal_https_only=False), INGEST, ADMIN) as client:
        yield client


async def dashboard(api: TestClient, path: str) -> tuple[int, str]:  # type: ignore[type-arg]
    response = await api.get(f"/dashboard/endpoints/default/{path}", headers=ADMIN_AUTH)
    return response.status, await response.text()


async def portal(api: TestClient, path: str, tenant: str = "acme") -> tuple[int, str]:  # type: ignore[type-arg]
    session = (await grant(api, tenant))["token"]
    response = await api.get(
        f"/portal/endpoints/default/{path}", headers={"Cookie": f"{PORTAL_COOKIE}={session}"}
    )
    return response.status, await response.text()


def summaries(page: str) -> dict[str, str]:
    """Each chart's aria-label, by its kind (outcomes, latency)."""
    return {
        kind: html.unescape(label)
        for kind, label in re.findall(r'<svg class="chart chart-(\w+)"[^>]* aria-label="([^"]*)"', page)
    }


def hovers(page: str, kind: str) -> list[str]:
    """The <title>s of one chart's buckets, oldest first."""
    svg = re.search(rf'<svg class="chart chart-{kind}".*?</svg>', page, re.S)
    assert svg is not None, page
    return [html.unescape(t) for t in re.findall(r"<title>([^<]*)</title>", svg[0])]


def numbers(page: str) -> list[list[str]]:
    """The table of the numbers: a row per bucket, its cells as shown."""
    table = re.search(r'<table class="chart-table">.*?</table>', page, re.S)
    assert table is not None, page
    return [
        [html.unescape(c).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row, re.S)]
        for row in re.findall(r"<tr data-bucket[^>]*>(.*?)</tr>", table[0], re.S)
    ]


async def test_both_faces_chart_what_a_real_worker_recorded(
    api: Any, db: asyncpg.Connection, receiver: Receiver, start_worker: Any
) -> None:
    # 503, 500, then 204: two failed attempts retried and one delivered.
    await flaky_history(db, receiver, start_worker)
    durations = [
        r["duration_seconds"] for r in await db.fetch("SELECT duration_seconds FROM delivery_attempts")
    ]
    assert len(durations) == 3

    for status, page in (await dashboard(api, "flaky"), await portal(api, "flaky")):
        assert status == 200, page
        said = summaries(page)
        assert said["outcomes"].startswith(
            "Attempts per hour over the last 24 hours: 1 delivered, 2 failed and retried,"
            " 0 failed for good (dead), 0 discarded."
        ), said
        # The current hour, the last bucket, holds them all; the 23 before are empty.
        shown = hovers(page, "outcomes")
        assert len(shown) == 24
        assert shown[-1].endswith(": 1 delivered, 2 failed and retried"), shown[-1]
        assert all(t.endswith(": no attempts") for t in shown[:-1])
        rows = numbers(page)
        assert len(rows) == 24
        # Postgres' percentile_cont of three values is their median.
        median = charts.duration_text(statistics.median(durations))
        assert rows[-1][1:6] == ["1", "2", "0", "0", median], rows[-1]
        assert all(r[1:5] == ["0", "0", "0", "0"] and r[5:] == ["-", "-"] for r in rows[:-1])
        assert f"median {median}" in hovers(page, "latency")[-1]
        # The switch is two links, the one shown marked.
        assert re.search(r'href="[^"]*span=24h" class="current" aria-current="page"', page)
        assert re.search(r'href="[^"]*span=7d">7 days', page)


async def test_seven_days_count_per_day_and_leave_older_attempts_out(
    api: Any, db: asyncpg.Connection
) -> None:
    endpoint = await add_endpoint(db, "weekly", NOWHERE)
    await record_attempts(db, endpoint, "delivered", "30 minutes", 4, status=204)
    await record_attempts(db, endpoint, "dead", "2 days", 5, status=500)
    # Leases that ran out: counted, but untimed.
    await record_attempts(db, endpoint, "retry", "3 days", 2, duration_seconds=None, failure="lease_expired")
    await record_attempts(db, endpoint, "delivered", "8 days", 7, status=204)

    status, week = await dashboard(api, "weekly?span=7d")
    assert status == 200, week
    assert summaries(week)["outcomes"].startswith(
        "Attempts per day over the last 7 days: 4 delivered, 2 failed and retried,"
        " 5 failed for good (dead), 0 discarded."
    )
    rows = numbers(week)
    assert len(rows) == 7
    counts = {tuple(r[1:5]) for r in rows if r[1:5] != ["0", "0", "0", "0"]}
    assert counts == {("4", "0", "0", "0"), ("0", "0", "5", "0"), ("0", "2", "0", "0")}
    # The untimed day has counts and no latency.
    [untimed] = [r for r in rows if r[2] == "2"]
    assert untimed[5:] == ["-", "-"]
    assert re.search(r'href="[^"]*span=7d" class="current"', week)

    _, day = await dashboard(api, "weekly")
    assert summaries(day)["outcomes"].startswith(
        "Attempts per hour over the last 24 hours: 4 delivered, 0 failed and retried,"
    )


async def test_an_endpoint_without_attempts_says_so_and_a_bad_span_is_refused(
    api: Any, db: asyncpg.Connection
) -> None:
    await add_endpoint(db, "quiet", NOWHERE)
    for status, page in (await dashboard(api, "quiet"), await portal(api, "quiet")):
        assert status == 200, page
        assert summaries(page) == {
            "outcomes": "Attempts per hour over the last 24 hours: no attempts.",
            "latency": "Latency per hour over the last 24 hours: no timed attempts.",
        }
        assert "No attempts in the last 24 hours" in page

    for status, page in (await dashboard(api, "quiet?span=1y"), await portal(api, "quiet?span=1y")):
        assert status == 422, page
        assert "span must be 24h or 7d, not &#39;1y&#39;" in page
        assert "<svg" not in page
    # Another tenant's endpoint has no charts to show: there is none.
    status, page = await portal(api, "quiet", tenant="globex")
    assert status == 404 and "<svg" not in page


async def test_the_charts_read_an_endpoints_attempts_from_the_index_alone(db: asyncpg.Connection) -> None:
    # 200 endpoints' attempts of the last hours, interleaved as workers
    # append them, vacuumed and analysed as autovacuum leaves them.
    await db.execute(
        """INSERT INTO endpoints (namespace, name, tenant, url, secret, partition)
           SELECT 'default', 'ep-' || i, 'acme', 'https://receiver.example/' || i, 'whsec_x', i % 32
           FROM generate_series(0, 199) AS i"""
    )
    await db.execute(
        """INSERT INTO delivery_attempts (delivery_id, attempt, endpoint_id, event_tenant, event_id,
                                          started_at, duration_seconds, outcome, recorded_at)
           SELECT n, 1, (SELECT min(id) FROM endpoints) + n % 200, 'acme', 'evt-' || n,
                  r.at, 0.1, 'delivered', r.at
           FROM generate_series(1, 40000) AS n,
                LATERAL (SELECT greatest(date_trunc('day', now()), now() - n * interval '1 second') AS at) r"""
    )
    await db.execute("VACUUM (ANALYZE) delivery_attempts")
    chart = QUERIES["endpoint_chart"]
    plan = "\n".join(
        r[0]
        for r in await db.fetch(
            "EXPLAIN (ANALYZE, COSTS OFF) " + chart.sql,
            *chart.args(namespace="default", name="ep-7", bucket_seconds=3600.0, buckets=24),
        )
    )
    today = await db.fetchval("SELECT 'delivery_attempts_' || to_char(now() AT TIME ZONE 'UTC', 'YYYYMMDD')")
    assert f"Index Only Scan using {today}_endpoint_id_recorded_at_outcome__idx" in plan, plan
    assert f"Seq Scan on {today}" not in plan, plan

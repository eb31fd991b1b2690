"""docs/receivers.md's catch-up example (examples/receivers/catch_up.py),
run as written with this Python: against a real ``hooklane api`` on the
tests' PostgreSQL, with a tenant token the admin API issued, and against a
fake API on loopback that answers what the real one never would."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

import hooklane
from hooklane.dev.postgres import free_port
from testsupport.fixtures import add_endpoint, api_process, wait_api_up, wait_for
from testsupport.receivers import Answer

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "receivers" / "catch_up.py"
ADMIN = "admin-token-0123456789"
# The API starts only with an ingest token too; the tests publish directly.
INGEST = "ingest-token-0123456789"
SINCE = "2020-01-01T00:00:00Z"
# An address nothing listens on: the receiver that missed every delivery.
NOWHERE = "http://127.0.0.1:9/hook"
# The example with its handler failing on one event id (argv[2]): a
# receiver's own handler, swapped in as the example says to.
FAILING = """
import importlib.util, sys
spec = importlib.util.spec_from_file_location("catch_up", sys.argv[1])
example = importlib.util.module_from_spec(spec)
spec.loader.exec_module(example)
handle = example.handle

def failing(event):
    if event["id"] == sys.argv[2]:
        raise RuntimeError("the receiver's database is down")
    handle(event)

example.handle = failing
sys.exit(example.main(sys.argv[3:]))
"""


@dataclass(frozen=True)
class Ran:
    status: int
    events: list[dict[str, Any]]
    stderr: str

    @property
    def ids(self) -> list[str]:
        return [e["id"] for e in self.events]


async def catch_up(base: str, token: str, state: Path, *args: str, failing_on: str | None = None) -> Ran:
    """One run of the example from its own folder, as the guide runs it."""
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
    env.update(HOOKLANE_URL=base, HOOKLANE_TENANT_TOKEN=token)
    argv = ["--state", str(state), *args]
    if failing_on is not None:
        argv = ["-c", FAILING, str(EXAMPLE), failing_on, *argv]
    else:
        argv = [EXAMPLE.name, *argv]
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        *argv,
        cwd=EXAMPLE.parent,
        env=env,
        stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=120)
    assert proc.returncode is not None
    stderr = err.decode()
    assert "Traceback" not in stderr, stderr
    return Ran(proc.returncode, [json.loads(line) for line in out.decode().splitlines()], stderr)


@asynccontextmanager
async def hooklane_api(dsn: str) -> AsyncIterator[str]:
    """``hooklane api`` as a process of its own; its base URL."""
    port = free_port()
    api = api_process(dsn, port, HOOKLANE_ADMIN_TOKENS=ADMIN, HOOKLANE_API_TOKENS=INGEST)
    base = f"http://127.0.0.1:{port}"
    try:
        async with aiohttp.ClientSession() as session:
            await wait_api_up(session, base, api)
        yield base
    finally:
        api.kill()
        api.wait()


async def tenant_token(base: str, tenant: str) -> str:
    """A read-only tenant token, as the platform issues it."""
    async with (
        aiohttp.ClientSession() as session,
        session.post(
            f"{base}/v1/admin/portal-sessions",
            headers={"Authorization": f"Bearer {ADMIN}"},
            json={"tenant": tenant, "kind": "token", "access": "read"},
        ) as response,
    ):
        body = await response.json()
        assert response.status == 201, body
        return body["token"]


async def publish(db, tenant: str, *numbers: int) -> None:
    for n in numbers:
        await hooklane.publish(db, tenant=tenant, type="order.paid", data={"order": n}, id=f"{tenant}-{n}")


def state_of(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


# --- against the real API ----------------------------------------------------------
async def test_runs_from_a_saved_position_hand_over_each_event_once_in_order(dsn, db, tmp_path):
    # Deliveries to nowhere: the receiver missed all of them.
    await add_endpoint(db, "acme-orders", NOWHERE, tenant="acme")
    await add_endpoint(db, "globex-orders", NOWHERE, tenant="globex")
    state = tmp_path / "catch-up.json"
    async with hooklane_api(dsn) as base:
        token = await tenant_token(base, "acme")
        for n in (1, 2, 3):
            await publish(db, "acme", n)
            await publish(db, "globex", n)
        first = await catch_up(base, token, state, "--since", SINCE, "--limit", "2")
        assert (first.status, first.ids) == (0, ["acme-1", "acme-2", "acme-3"]), first.stderr
        assert first.events[0]["type"] == "order.paid" and first.events[0]["data"] == {"order": 1}
        assert "caught up, 3 events handled" in first.stderr
        for n in (4, 5, 6):
            await publish(db, "globex", n)
            await publish(db, "acme", n)
        second = await catch_up(base, token, state, "--limit", "2")
        assert (second.status, second.ids) == (0, ["acme-4", "acme-5", "acme-6"]), second.stderr
        third = await catch_up(base, token, state)
        assert (third.status, third.ids) == (0, []), third.stderr
        # A position is continued from, never restarted by mistake.
        again = await catch_up(base, token, state, "--since", SINCE)
        assert again.status == 1 and "already holds a position" in again.stderr


async def test_a_failing_handler_repeats_from_the_saved_cursor_and_skips_nothing(dsn, db, tmp_path):
    await publish(db, "acme", 1, 2, 3, 4, 5)
    await publish(db, "globex", 1)
    state = tmp_path / "catch-up.json"
    async with hooklane_api(dsn) as base:
        token = await tenant_token(base, "acme")
        failed = await catch_up(base, token, state, "--since", SINCE, "--limit", "2", failing_on="acme-4")
        assert (failed.status, failed.ids) == (1, ["acme-1", "acme-2", "acme-3"])
        assert "handling event acme-4 failed (RuntimeError: the receiver's database is down)" in failed.stderr
        assert "the next run starts again from it" in failed.stderr
        # The cursor saved is the first page's: acme-3 is after it, and
        # recorded as handled.
        saved = state_of(state)
        assert saved["handled"] == ["acme-3"] and saved["cursor"]
        # Had the run died before recording acme-3, the next would hand
        # acme-3 over again: repeated, never skipped.
        lost = tmp_path / "lost.json"
        lost.write_text(json.dumps({**saved, "handled": []}))
        repeated = await catch_up(base, token, lost, "--limit", "2")
        assert (repeated.status, repeated.ids) == (0, ["acme-3", "acme-4", "acme-5"]), repeated.stderr
        resumed = await catch_up(base, token, state, "--limit", "2")
        assert (resumed.status, resumed.ids) == (0, ["acme-4", "acme-5"]), resumed.stderr
        assert failed.ids + resumed.ids == [f"acme-{n}" for n in range(1, 6)]
        assert state_of(state)["handled"] == []


async def test_a_caught_up_event_is_the_delivered_one(dsn, db, receiver, start_worker, tmp_path):
    """The handler gets what a delivery's body holds, and the event's id is
    the delivery's webhook-id: one store of ids deduplicates both."""
    await add_endpoint(db, "orders", receiver.on("orders", Answer(204)))
    start_worker()
    await hooklane.publish(db, tenant="acme", type="order.paid", data={"n": 1e-7, "note": "é ✓"}, id="paid-1")
    await hooklane.publish(
        db, tenant="acme", type="order.sent", data={"big": 10**16, "list": []}, id="sent-1"
    )
    got = await wait_for(lambda: len(receiver.at("orders")) == 2 and receiver.at("orders"))
    delivered = {r.headers["webhook-id"]: json.loads(r.body) for r in got}
    async with hooklane_api(dsn) as base:
        ran = await catch_up(base, await tenant_token(base, "acme"), tmp_path / "s.json", "--since", SINCE)
    assert ran.status == 0, ran.stderr
    assert ran.ids == ["paid-1", "sent-1"]
    assert {e["id"]: e for e in ran.events} == delivered


async def test_a_refused_token_says_to_ask_for_a_new_one(dsn, db, tmp_path):
    await publish(db, "acme", 1)
    async with hooklane_api(dsn) as base:
        expired, ended = await tenant_token(base, "acme"), await tenant_token(base, "acme")
        await db.execute(
            "UPDATE portal_grants SET expires_at = now() - interval '1 s' WHERE digest = sha256($1::bytea)",
            expired.encode(),
        )
        async with (
            aiohttp.ClientSession() as session,
            session.delete(
                f"{base}/v1/tenant/session", headers={"Authorization": f"Bearer {ended}"}
            ) as ending,
        ):
            assert ending.status == 204
        for token in (expired, ended, "hlps_" + "x" * 43, ADMIN):
            state = tmp_path / "never-written.json"
            ran = await catch_up(base, token, state, "--since", SINCE)
            assert (ran.status, ran.events) == (1, []), token
            assert "the tenant token was refused (HTTP 401)" in ran.stderr
            assert "Ask your platform for a new one and set HOOKLANE_TENANT_TOKEN" in ran.stderr
            assert token not in ran.stderr
            assert not state.exists()


# --- against a fake API --------------------------------------------------------------

Behaviour = Callable[[web.Request], web.StreamResponse]


@dataclass
class FakeApi:
    """Answers the listing with ``answers`` in turn, the last one from then on."""

    answers: list[Behaviour]
    seen: list[tuple[float, web.Request]] = field(default_factory=list)

    async def listing(self, request: web.Request) -> web.StreamResponse:
        self.seen.append((time.monotonic(), request))
        return self.answers[min(len(self.seen), len(self.answers)) - 1](request)


@asynccontextmanager
async def fake_api(*answers: Behaviour) -> AsyncIterator[tuple[str, FakeApi]]:
    fake = FakeApi(list(answers))
    app = web.Application()
    app.router.add_get("/v1/tenant/events", fake.listing)
    async with TestServer(app, host="127.0.0.1") as server:
        yield str(server.make_url("")).rstrip("/"), fake


EVENT = {
    "id": "acme-1",
    "type": "order.paid",
    "created_at": "2026-03-01T08:00:00.041123Z",
    "fanout": 1,
    "data": {},
}


def page(*events: dict[str, Any], cursor: str = "c1") -> Behaviour:
    return lambda _: web.json_response({"events": list(events), "next_cursor": cursor})


def unavailable(retry_after: str) -> Behaviour:
    body = {"error": "unavailable", "detail": "the database is not answering"}
    return lambda _: web.json_response(body, status=503, headers={"Retry-After": retry_after})


async def test_an_unavailable_api_is_waited_for_as_it_asks(tmp_path):
    async with fake_api(unavailable("1"), page(EVENT)) as (base, fake):
        ran = await catch_up(base, "hlps_token", tmp_path / "s.json", "--since", SINCE, "--limit", "5")
    assert (ran.status, ran.ids) == (0, ["acme-1"]), ran.stderr
    assert "the API is unavailable (HTTP 503); trying again in 1 s" in ran.stderr
    assert ran.events[0]["timestamp"] == "2026-03-01T08:00:00.041Z"
    (first, _), (second, request) = fake.seen
    assert second - first >= 1
    assert request.headers["Authorization"] == "Bearer hlps_token"
    assert dict(request.query) == {"since": SINCE, "limit": "5"}


@pytest.mark.parametrize(
    ("retry_after", "tries", "said"),
    [
        ("0", 5, "the API is unavailable (HTTP 503); gave up after 5 tries: run again later"),
        ("3600", 1, "the API is unavailable (HTTP 503) and asks to wait 3600 s: run again after that"),
    ],
)
async def test_an_api_that_stays_unavailable_ends_the_run_with_a_message(tmp_path, retry_after, tries, said):
    async with fake_api(unavailable(retry_after)) as (base, fake):
        ran = await catch_up(base, "hlps_token", tmp_path / "s.json", "--since", SINCE)
    assert (ran.status, ran.events) == (1, [])
    assert said in ran.stderr
    assert len(fake.seen) == tries


def redirect(_: web.Request) -> web.StreamResponse:
    raise web.HTTPFound("/elsewhere/v1/tenant/events")


def huge(_: web.Request) -> web.StreamResponse:
    return web.Response(body=b" " * (3 * 1024 * 1024), content_type="application/json")


@pytest.mark.parametrize(
    ("answer", "said"),
    [
        (redirect, "the API redirects to '/elsewhere/v1/tenant/events' (HTTP 302)"),
        (huge, "the API's answer is longer than 1114112 bytes"),
        (lambda _: web.Response(text="<html>hello</html>"), "the API's answer is not a page of events"),
        (
            lambda _: web.Response(text="[" * 100_000 + "]" * 100_000),
            "the API's answer is not a page of events",
        ),
        (page(EVENT, cursor=""), "the API's page of events is malformed"),
        (page(EVENT, {**EVENT, "id": "acme-2"}), "the API's page of events is malformed"),
        (page({**EVENT, "id": 7}), "the API's page holds a malformed event"),
        (page({**EVENT, "created_at": "yesterday"}), "event acme-1 has no valid created_at"),
        (lambda _: web.json_response({}, status=404), "/v1/tenant/events does not exist (HTTP 404)"),
        (
            lambda _: web.json_response(
                {"error": "invalid", "field": "since", "detail": "is no time\n"}, status=422
            ),
            "the API refused the listing (HTTP 422): since is no time?",
        ),
    ],
)
async def test_a_broken_or_hostile_answer_stops_with_a_message(tmp_path, answer, said):
    state = tmp_path / "s.json"
    async with fake_api(answer) as (base, fake):
        ran = await catch_up(base, "hlps_token", state, "--since", SINCE, "--limit", "1")
    assert (ran.status, ran.events) == (1, []), ran.stderr
    assert said in ran.stderr
    assert len(fake.seen) == 1
    assert not state.exists()


async def test_a_page_that_does_not_move_the_cursor_stops_the_run(tmp_path):
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"since": SINCE, "cursor": "c1", "handled": []}))
    async with fake_api(page(EVENT, cursor="c1")) as (base, _):
        ran = await catch_up(base, "hlps_token", state)
    assert (ran.status, ran.events) == (1, [])
    assert "did not move its cursor" in ran.stderr


@pytest.mark.parametrize(
    ("env", "state", "said"),
    [
        ({"HOOKLANE_URL": ""}, None, "set HOOKLANE_URL"),
        ({"HOOKLANE_URL": "http://hooklane.example.com"}, None, "HOOKLANE_URL is http: use https"),
        ({"HOOKLANE_URL": "ftp://x"}, None, "HOOKLANE_URL is not an http(s) address"),
        ({"HOOKLANE_URL": "https://u:p@x"}, None, "must not hold credentials"),
        ({"HOOKLANE_TENANT_TOKEN": ""}, None, "set HOOKLANE_TENANT_TOKEN"),
        ({"HOOKLANE_TENANT_TOKEN": "hlps_a\nb"}, None, "HOOKLANE_TENANT_TOKEN is not a token"),
        ({}, "{not json", "is not a state file of this script"),
        ({}, '{"since": 1, "cursor": null, "handled": []}', "is not a state file of this script"),
    ],
)
async def test_bad_settings_or_state_say_what_to_fix(tmp_path, env, state, said):
    path = tmp_path / "s.json"
    args: tuple[str, ...] = ("--since", SINCE)
    if state is not None:
        path.write_text(state)
        args = ()
    async with fake_api(page()) as (base, fake):
        url, token = env.get("HOOKLANE_URL", base), env.get("HOOKLANE_TENANT_TOKEN", "hlps_token")
        ran = await catch_up(url, token, path, *args)
    assert (ran.status, ran.events) == (1, []), ran.stderr
    assert said in ran.stderr
    assert fake.seen == []


async def test_the_first_run_needs_a_time_to_start_from(tmp_path):
    async with fake_api(page()) as (base, fake):
        ran = await catch_up(base, "hlps_token", tmp_path / "s.json")
    assert (ran.status, ran.events) == (1, [])
    assert "does not exist yet: give --since" in ran.stderr
    assert fake.seen == []

"""The API against its own OpenAPI document: schemathesis generates
requests for every operation from ``hooklane/api/openapi.json``, valid and
not, and sends them to a real ``hooklane api`` process on a real Postgres.
No answer may be a server error, and every answer must be one the document
describes (status, content type, headers, body schema)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import tempfile
import time
from collections.abc import Iterator
from importlib import resources
from typing import Any
from urllib.error import URLError
from urllib.request import Request, urlopen

import asyncpg
import pytest
import schemathesis
import schemathesis.checks
from hypothesis import HealthCheck, given, settings

from hooklane import store
from hooklane.api.app import make_app
from hooklane.api.auth import Audience
from hooklane.api.tokens import TokenSource
from hooklane.dev.postgres import free_port
from hooklane.settings import Settings
from hooklane.spec import EndpointSpec
from hooklane.tokens import Tokens
from testsupport.fixtures import SECRET, api_process

# One token in both lists, so that every operation is reachable with one header.
TOKEN = "schemathesis-token-0123456789"


async def _seed(dsn: str) -> None:
    """Endpoints and events for the admin operations to find."""
    conn = await asyncpg.connect(dsn)
    try:
        for name, tenant in (("orders", "acme"), ("billing", "globex")):
            spec = EndpointSpec(
                namespace="default", name=name, url="https://receiver.example/hook", tenant=tenant
            )
            await store.upsert_endpoint(conn, spec, SECRET)
        async with conn.transaction():
            for n in range(3):
                await store.insert_event(
                    conn,
                    id=f"seed-{n}",
                    tenant="acme",
                    type="order.created",
                    data_json="{}",
                    coalesce_key=None,
                )
    finally:
        await conn.close()


@pytest.fixture
def api_schema(dsn: str) -> Iterator[schemathesis.BaseSchema]:
    asyncio.run(_seed(dsn))
    port = free_port()
    with tempfile.TemporaryFile("w+") as log:
        api = api_process(
            dsn,
            port,
            stderr=log,
            HOOKLANE_API_TOKENS=TOKEN,
            HOOKLANE_ADMIN_TOKENS=TOKEN,
            HOOKLANE_PORTAL_ENDPOINTS="local",
            # Small, so that generated bodies reach the limit too.
            HOOKLANE_API_MAX_BODY_BYTES="65536",
        )
        try:
            yield _schema(api, f"http://127.0.0.1:{port}")
        finally:
            api.terminate()
            api.wait(timeout=30)
            log.seek(0)
            stderr = log.read()
        # A handler's unexpected exception is logged by aiohttp with its traceback.
        assert "Traceback" not in stderr, stderr


def _schema(api: subprocess.Popen[bytes], base: str) -> schemathesis.BaseSchema:
    deadline = time.monotonic() + 30
    while True:
        try:
            with urlopen(f"{base}/healthz", timeout=2):
                break
        except (URLError, ConnectionError):
            assert api.poll() is None, "hooklane api exited"
            assert time.monotonic() < deadline, "hooklane api did not start"
            time.sleep(0.1)
    # The document as served, which must be the one kept in the repository.
    with urlopen(f"{base}/openapi.json", timeout=5) as response:
        assert json.load(response) == json.loads(
            resources.files("hooklane.api").joinpath("openapi.json").read_text()
        )
    return schemathesis.openapi.from_url(f"{base}/openapi.json")


def _served() -> set[tuple[str, str]]:
    """The app's routes but the dashboard's and the portal's pages, which
    are HTML for people."""
    tokens = TokenSource(Tokens.parse(TOKEN, "test"), None, "test")
    app = make_app(Settings(), None, tokens, tokens)  # type: ignore[arg-type]
    return {
        (route.method, route.resource.canonical)
        for route in app.router.routes()
        if route.method != "HEAD"
        and route.resource is not None
        and getattr(route.handler, "audience", None) not in (Audience.DASHBOARD, Audience.PORTAL)
        and not route.resource.canonical.startswith(("/dashboard", "/portal"))
    }


def _tenant_token(schema: schemathesis.BaseSchema) -> str:
    """A tenant token of acme with every right, from the admin API."""
    request = Request(
        schema.get_base_url().rstrip("/") + "/v1/admin/portal-sessions",
        data=json.dumps({"tenant": "acme", "access": "manage", "kind": "token"}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"},
    )
    with urlopen(request, timeout=5) as response:
        token: str = json.load(response)["token"]
    return token


def test_every_answer_is_in_the_document(api_schema: schemathesis.BaseSchema) -> None:
    # Hypothesis drives each operation's strategy directly: schemathesis'
    # own pytest plugin does not run under this pytest.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    documented = {(o.method.upper(), o.path) for o in operations}
    # schemathesis leaves out the document's own path, which it read above.
    assert documented | {("GET", "/openapi.json")} == _served(), "the document and the app's routes differ"
    for operation in operations:
        # A tenant route's own token, fresh for each: one of them ends it.
        token = _tenant_token(api_schema) if operation.path.startswith("/v1/tenant") else TOKEN
        _check_answers(operation, {"Authorization": f"Bearer {token}"})


def _check_answers(operation: Any, headers: dict[str, str]) -> None:
    @given(case=operation.as_strategy())
    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), database=None)
    def answer_is_described(case: schemathesis.Case) -> None:
        case.call_and_validate(
            headers=headers,
            # Data the document allows may still be refused with a 422
            # the document describes: no NUL in a text or key (Postgres'
            # jsonb), integers within 64 bits, the size once encoded.
            # JSON Schema cannot say those rules.
            excluded_checks=[schemathesis.checks.positive_data_acceptance],
        )

    answer_is_described()

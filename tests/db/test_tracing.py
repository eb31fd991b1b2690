"""Traces from the producer to the receiver (issue 22): the API, a worker
and a receiver on loopback, and a real OTLP/HTTP collector receiving what
the SDK exports. From processes: tests/processes/test_tracing.py."""

from __future__ import annotations

import asyncio
import re

import pytest
from aiohttp.test_utils import TestClient, TestServer
from opentelemetry.sdk.trace import TracerProvider

import hooklane
from hooklane import tracing
from hooklane.errors import InvalidInput, StoreError
from hooklane.policies import RetryPolicy
from hooklane.traceparent import format_traceparent, parse_traceparent
from hooklane.worker import probes
from testsupport.fixtures import add_endpoint, in_process_api, wait_for
from testsupport.receivers import Answer
from testsupport.tracing import producer_span

INGEST = "ingest-token-tracing-0123456789"
ADMIN = "admin-token-tracing-0123456789"
AUTH = {"Authorization": f"Bearer {INGEST}"}
EVENT = {"type": "order.created", "tenant": "acme", "data": {"order": 1}}
FAST_RETRY = RetryPolicy(base_seconds=0.2, cap_seconds=1.0)
_ATTEMPTS = "SELECT attempt, status, trace_id FROM delivery_attempts ORDER BY attempt"


async def test_a_trace_runs_from_the_producer_through_the_api_to_each_attempt(
    db, dsn, settings, receiver, start_worker, traced
):
    trace_id, producer, traceparent = producer_span()
    url = receiver.on("traced", lambda n: Answer(503) if n == 0 else Answer(204))
    await add_endpoint(db, "traced", url)
    async with in_process_api(dsn, settings, INGEST, ADMIN) as client:
        response = await client.post("/v1/events", json=EVENT, headers={**AUTH, "traceparent": traceparent})
        assert response.status == 202, await response.text()
    running = start_worker(retry=FAST_RETRY)
    await wait_for(lambda: len(receiver.at("traced")) == 2)
    await wait_for(lambda: db.fetchval("SELECT state = 'delivered' FROM deliveries"))
    await running.stop()
    attempts = await db.fetch(_ATTEMPTS)
    await asyncio.to_thread(tracing.shutdown)

    (ingest,) = traced.named("POST /v1/events")
    assert (ingest.kind, ingest.trace_id, ingest.parent_span_id) == ("server", trace_id, producer)
    assert ingest.attributes["http.response.status_code"] == 202
    calls = sorted(traced.named("webhook deliver"), key=lambda s: s.attributes["hooklane.attempt"])
    assert [c.attributes["hooklane.attempt"] for c in calls] == [1, 2]
    for call, received in zip(calls, receiver.at("traced"), strict=True):
        assert (call.kind, call.trace_id, call.parent_span_id) == ("client", trace_id, ingest.span_id)
        sent = parse_traceparent(received.headers["traceparent"], "traceparent")
        assert (sent.trace_id, sent.span_id) == (trace_id, call.span_id)
        assert call.attributes["hooklane.endpoint"] == "default/traced"
        assert call.attributes["hooklane.tenant"] == "acme"
        assert call.attributes["server.address"] == "127.0.0.1"
        # Each came from a reservation round whose span it links to.
        ((link_trace, link_span),) = call.links
        (round_span,) = [s for s in traced.named("reserve") if s.span_id == link_span]
        assert round_span.trace_id == link_trace and round_span.attributes["hooklane.reserved"] >= 1
    failed, delivered = calls
    assert (failed.attributes["http.response.status_code"], failed.status) == (503, "error")
    assert failed.attributes["hooklane.outcome"] == "retry"
    assert (delivered.attributes["http.response.status_code"], delivered.status) == (204, "unset")
    assert "hooklane.failure" not in delivered.attributes
    assert traced.named("record")
    assert [(a["attempt"], a["status"], a["trace_id"]) for a in attempts] == [
        (1, 503, trace_id),
        (2, 204, trace_id),
    ]
    # The attempt durations' exemplars name the trace, in OpenMetrics only.
    async with TestClient(TestServer(probes.application(lambda: True))) as metrics:
        plain = await (await metrics.get("/metrics")).text()
        asked = await metrics.get(
            "/metrics", headers={"Accept": "application/openmetrics-text; version=1.0.0"}
        )
        assert asked.headers["Content-Type"].startswith("application/openmetrics-text")
        openmetrics = await asked.text()
    assert f'trace_id="{trace_id}"' in openmetrics and "trace_id" not in plain
    exemplified = [line for line in openmetrics.splitlines() if trace_id in line]
    assert {line.split("{")[0] for line in exemplified} == {"hooklane_attempt_duration_seconds_bucket"}
    assert sorted(re.findall(r'outcome="(\w+)"', "\n".join(exemplified))) == ["delivered", "retry"]


async def test_an_event_published_without_a_trace_starts_one_at_its_attempt(
    db, dsn, settings, receiver, start_worker, traced
):
    await add_endpoint(db, "fresh", receiver.on("fresh", Answer(204)))
    await hooklane.publish(db, tenant="acme", type="order.created", data={})
    start_worker()
    await wait_for(lambda: receiver.at("fresh"))
    await wait_for(lambda: db.fetchval("SELECT count(*) = 1 FROM delivery_attempts"))
    await asyncio.to_thread(tracing.shutdown)
    (call,) = traced.named("webhook deliver")
    assert call.parent_span_id == ""
    sent = parse_traceparent(receiver.at("fresh")[0].headers["traceparent"], "traceparent")
    assert (sent.trace_id, sent.span_id) == (call.trace_id, call.span_id)
    assert await db.fetchval("SELECT trace_id FROM delivery_attempts") == call.trace_id


async def test_a_malformed_traceparent_header_is_refused_naming_it(dsn, settings):
    async with in_process_api(dsn, settings, INGEST, ADMIN) as client:
        for path, body in (("/v1/events", EVENT), ("/v1/events/batch", {"events": [EVENT]})):
            for bad in (
                "00-" + "0" * 32 + "-00f067aa0ba902b7-01",
                "01-abc",
                "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            ):
                response = await client.post(path, json=body, headers={**AUTH, "traceparent": bad})
                assert response.status == 400
                problem = await response.json()
                assert (problem["error"], problem["field"]) == ("malformed", "traceparent")
                assert "traceparent header" in problem["detail"]


async def test_untraced_the_api_stores_the_producers_header_as_it_came(db, dsn, settings):
    assert not tracing.enabled()
    _, _, traceparent = producer_span()
    async with in_process_api(dsn, settings, INGEST, ADMIN) as client:
        one = await client.post("/v1/events", json=EVENT, headers={**AUTH, "traceparent": traceparent})
        batch = await client.post(
            "/v1/events/batch", json={"events": [EVENT, EVENT]}, headers={**AUTH, "traceparent": traceparent}
        )
        bare = await client.post("/v1/events", json=EVENT, headers=AUTH)
        assert (one.status, batch.status, bare.status) == (202, 202, 202)
        bare_id = (await bare.json())["id"]
    rows = await db.fetch("SELECT id, traceparent FROM events")
    assert sorted(r["traceparent"] or "" for r in rows) == ["", traceparent, traceparent, traceparent]
    assert next(r["traceparent"] for r in rows if r["id"] == bare_id) is None


async def test_publish_takes_the_callers_current_span_or_an_explicit_traceparent(db):
    tracer = TracerProvider().get_tracer("the-application")
    _, _, explicit = producer_span()
    with tracer.start_as_current_span("checkout") as span:
        current = span.get_span_context()
        implicit_id = await hooklane.publish(db, tenant="acme", type="order.created", data={})
        explicit_id = await hooklane.publish(
            db, tenant="acme", type="order.created", data={}, traceparent=explicit
        )
        with pytest.raises(InvalidInput) as refused:
            await hooklane.publish(db, tenant="acme", type="order.created", data={}, traceparent="00-junk")
    assert refused.value.field == "traceparent"
    bare_id = await hooklane.publish(db, tenant="acme", type="order.created", data={})
    stored = dict(await db.fetch("SELECT id, traceparent FROM events"))
    assert stored == {
        implicit_id: format_traceparent(current.trace_id, current.span_id, current.trace_flags),
        explicit_id: explicit,
        bare_id: None,
    }


@pytest.mark.parametrize("accept", ["text/plain; version=zz", "application/openmetrics-text; version=abc"])
async def test_a_scrapers_accept_header_that_does_not_parse_gets_the_text_format(accept):
    async with TestClient(TestServer(probes.application(lambda: True))) as metrics:
        answer = await metrics.get("/metrics", headers={"Accept": accept})
        assert answer.status == 200
        assert answer.headers["Content-Type"].startswith("text/plain")
        assert "hooklane_attempt_duration_seconds" in await answer.text()


@pytest.mark.parametrize(
    "value",
    [
        "00-" + "0" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "a" * 32 + "-" + "0" * 16 + "-01",
        "01-" + "a" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "A" * 32 + "-" + "b" * 16 + "-01",
        "00-" + "a" * 32 + "-" + "b" * 16 + "-01\r\nX-Injected: 1",
    ],
)
async def test_the_database_refuses_a_traceparent_that_is_not_one_whoever_writes_it(db, value):
    # What is stored is sent to receivers as a header: a writer other than
    # hooklane.publish (SQL by hand, another language) gets the same rule.
    with pytest.raises(StoreError, match="events_traceparent_format"):
        await db.execute(
            "INSERT INTO events (id, tenant, type, data, fanout, traceparent) VALUES ('e', 'acme', 't', '{}', 0, $1)",
            value,
        )
    with pytest.raises(InvalidInput, match="traceparent"):
        parse_traceparent(value, "traceparent")

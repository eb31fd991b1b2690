"""Traces from processes (issue 22): a worker and ``hooklane publish``,
traced by their environment or not, against a real OTLP/HTTP collector."""

from __future__ import annotations

import asyncio
import signal
import tempfile

import hooklane
from hooklane import store
from testsupport.cli import hooklane as hooklane_command
from testsupport.fixtures import add_endpoint, wait_for, worker_process
from testsupport.receivers import Answer
from testsupport.tracing import producer_span


async def _deliver_by_process(dsn, receiver, collector, path: str, traceparents: list[str | None], **env):
    """Events published with ``traceparents``, delivered by a ``hooklane
    worker`` process whose OTLP endpoint is ``collector``, and ``env``;
    stopped (SIGTERM: it flushes its spans) once every one was received."""
    conn = await store.connect(dsn)
    try:
        await add_endpoint(conn, path, receiver.on(path, Answer(204)))
        for traceparent in traceparents:
            await hooklane.publish(conn, tenant="acme", type="t.x", data={}, traceparent=traceparent)
        with tempfile.TemporaryFile("w+") as log:
            worker = worker_process(
                dsn,
                stderr=log,
                OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.url,
                OTEL_BSP_SCHEDULE_DELAY="100",
                **env,
            )
            try:
                await wait_for(lambda: len(receiver.at(path)) == len(traceparents), timeout=30)
                await wait_for(
                    lambda: conn.fetchval("SELECT count(*) = $1 FROM delivery_attempts", len(traceparents)),
                    timeout=30,
                )
            finally:
                worker.send_signal(signal.SIGTERM)
                code = await asyncio.to_thread(worker.wait, 30)
                log.seek(0)
                stderr = log.read()
            assert code == 0, stderr
        return {
            r["event_id"]: r["trace_id"]
            for r in await conn.fetch("SELECT event_id, trace_id FROM delivery_attempts")
        }
    finally:
        await conn.close()


async def test_a_worker_traced_by_its_environment_exports_its_spans(dsn, receiver, collector):
    trace_id, producer, traceparent = producer_span()
    await _deliver_by_process(
        dsn,
        receiver,
        collector,
        "env",
        [traceparent],
        OTEL_TRACES_EXPORTER="otlp",
        OTEL_SERVICE_NAME="worker-a",
    )
    (call,) = collector.named("webhook deliver")
    assert (call.service, call.trace_id, call.parent_span_id) == ("worker-a", trace_id, producer)
    (received,) = receiver.at("env")
    assert received.headers["traceparent"] == f"00-{trace_id}-{call.span_id}-01"


async def test_untraced_nothing_is_exported_and_only_a_publishers_traceparent_is_passed_on(
    dsn, receiver, collector
):
    trace_id, _, traceparent = producer_span()
    # The endpoint is set, as a cluster's may be; OTEL_TRACES_EXPORTER is not.
    recorded = await _deliver_by_process(dsn, receiver, collector, "off", [traceparent, None])
    with_trace, without = sorted(receiver.at("off"), key=lambda r: "traceparent" not in r.headers)
    assert with_trace.headers["traceparent"] == traceparent
    assert "traceparent" not in without.headers
    assert sorted(recorded.values(), key=str) == sorted([trace_id, None], key=str)
    # The worker exited after its deliveries were recorded: any span it made
    # would have been exported by then.
    assert collector.requests == 0 and collector.spans == []


async def test_hooklane_publish_joins_its_traceparent_traced_or_not(dsn, db, collector):
    trace_id, producer, traceparent = producer_span()

    def publish(event_id: str, **env: str):
        return hooklane_command(
            dsn,
            "publish",
            "--tenant",
            "acme",
            "--type",
            "order.created",
            "--data",
            "{}",
            "--id",
            event_id,
            "--traceparent",
            traceparent,
            OTEL_EXPORTER_OTLP_TRACES_ENDPOINT=collector.url,
            **env,
        )

    plain = await asyncio.to_thread(publish, "plain")
    traced = await asyncio.to_thread(publish, "traced", OTEL_TRACES_EXPORTER="otlp")
    refused = await asyncio.to_thread(publish, "refused", OTEL_TRACES_EXPORTER="console")
    assert (plain.returncode, traced.returncode) == (0, 0), (plain.stderr, traced.stderr)
    assert refused.returncode == 2 and "OTEL_TRACES_EXPORTER: must be otlp or none" in refused.stderr
    (span,) = collector.spans
    assert (span.name, span.service, span.trace_id, span.parent_span_id) == (
        "publish",
        "hooklane-publish",
        trace_id,
        producer,
    )
    stored = dict(await db.fetch("SELECT id, traceparent FROM events"))
    assert stored == {"plain": traceparent, "traced": f"00-{trace_id}-{span.span_id}-01"}

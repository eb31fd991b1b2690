"""An OTLP/HTTP collector that keeps nothing: it takes the spans a traced
worker exports (``POST /v1/traces``, protobuf) and counts them, so that a
benchmark measures what exporting costs the worker, not what a collector
costs. It runs in the benchmark's driver, whose CPU is not counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

from bench.common import free_ports


@dataclass
class Received:
    requests: int = 0
    spans: int = 0
    bytes: int = 0


@asynccontextmanager
async def otlp_sink() -> AsyncIterator[tuple[str, Received]]:
    """The traces endpoint's URL, and what it has received so far."""
    received = Received()

    async def traces(request: web.Request) -> web.Response:
        body = await request.read()
        exported = ExportTraceServiceRequest.FromString(body)
        received.requests += 1
        received.bytes += len(body)
        received.spans += sum(len(s.spans) for r in exported.resource_spans for s in r.scope_spans)
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_post("/v1/traces", traces)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    port = free_ports(1)[0]
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}/v1/traces", received
    finally:
        await runner.cleanup()


def tracing_env(url: str) -> dict[str, str]:
    """A worker's environment for tracing every delivery, exported to ``url``."""
    return {
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": url,
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_SERVICE_NAME": "hooklane-worker-bench",
    }

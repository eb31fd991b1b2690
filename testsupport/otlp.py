"""A real OTLP/HTTP trace collector on loopback: ``POST /v1/traces`` of
``application/x-protobuf``, decoded with opentelemetry-proto, its spans
kept flattened for the tests to read."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from aiohttp import web
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, Status

KIND = {Span.SPAN_KIND_SERVER: "server", Span.SPAN_KIND_CLIENT: "client", Span.SPAN_KIND_INTERNAL: "internal"}
STATUS = {Status.STATUS_CODE_UNSET: "unset", Status.STATUS_CODE_OK: "ok", Status.STATUS_CODE_ERROR: "error"}


@dataclass(frozen=True)
class Exported:
    """One span as the collector received it; ids as lowercase hex, the
    parent's "" for a root."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    attributes: dict[str, Any]
    status: str
    links: list[tuple[str, str]]


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value"))


class Collector:
    def __init__(self) -> None:
        self.spans: list[Exported] = []
        self.requests = 0
        app = web.Application()
        app.router.add_post("/v1/traces", self._export)
        self._runner = web.AppRunner(app, access_log=None)
        self.url = ""

    async def _export(self, request: web.Request) -> web.Response:
        assert request.content_type == "application/x-protobuf", request.content_type
        export = ExportTraceServiceRequest.FromString(await request.read())
        self.requests += 1
        for resource_spans in export.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    self.spans.append(
                        Exported(
                            service=resource.get("service.name", ""),
                            name=span.name,
                            kind=KIND.get(span.kind, str(span.kind)),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes={a.key: _value(a.value) for a in span.attributes},
                            status=STATUS[span.status.code],
                            links=[(link.trace_id.hex(), link.span_id.hex()) for link in span.links],
                        )
                    )
        return web.Response(
            body=ExportTraceServiceResponse().SerializeToString(), content_type="application/x-protobuf"
        )

    def named(self, name: str) -> list[Exported]:
        return [s for s in self.spans if s.name == name]

    async def __aenter__(self) -> Collector:
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}/v1/traces"
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self._runner.cleanup()

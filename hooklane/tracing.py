"""OpenTelemetry traces: off unless ``OTEL_TRACES_EXPORTER=otlp``.

Set up once per process (:func:`configure`, called by the CLI for the
worker, the API and the commands it runs) with the SDK's
``BatchSpanProcessor`` and OTLP/HTTP exporter, both configured by the
standard ``OTEL_*`` variables; :func:`shutdown` sends what is left at exit.
Off, nothing is set up, the SDK is not even imported, and the roles guard
each span with :func:`enabled`: no span object is made on the hot path.

The provider is this module's own, not OpenTelemetry's global one: the
global can be set once per process only, and Hooklane makes its spans
itself (no instrumentation library reads the global).

Spans (docs/operations.md, "Traces"): the API's ``POST /v1/events`` SERVER
span, the worker's CLIENT span per attempt (the receiver's
``traceparent`` names it), and a span per reservation round and per
batch of results recorded."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, Status, StatusCode
from opentelemetry.trace import TraceFlags as OtelTraceFlags

from hooklane.errors import InvalidInput
from hooklane.results import Result, ResultOutcome
from hooklane.traceparent import format_traceparent, parse_traceparent

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider

logger = logging.getLogger(__name__)

_provider: TracerProvider | None = None
_tracer: trace.Tracer | None = None
_NO_SPAN: AbstractContextManager[None] = nullcontext()


def wanted(environ: Mapping[str, str]) -> bool:
    """Whether the environment asks for traces: ``OTEL_TRACES_EXPORTER=otlp``
    and the SDK not disabled (``OTEL_SDK_DISABLED=true``). Unset or
    ``none`` is off, unlike the SDK's own default of otlp: a process
    should not start sending spans to localhost because of an upgrade.
    Other exporters and OTLP over gRPC are refused, naming the variable,
    rather than ignored: they are not installed."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = [e.strip() for e in environ.get("OTEL_TRACES_EXPORTER", "").split(",") if e.strip()]
    if exporters in ([], ["none"]):
        return False
    if exporters != ["otlp"]:
        raise InvalidInput("OTEL_TRACES_EXPORTER", f"must be otlp or none, not {','.join(exporters)!r}")
    for variable in ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL"):
        protocol = environ.get(variable, "").strip()
        if protocol:
            if protocol != "http/protobuf":
                raise InvalidInput(variable, f"must be http/protobuf (OTLP over HTTP), not {protocol!r}")
            break
    return True


def configure(service: str, environ: Mapping[str, str] = os.environ) -> bool:
    """Start tracing as ``service`` (unless ``OTEL_SERVICE_NAME`` or
    ``OTEL_RESOURCE_ATTRIBUTES`` name it) if the environment asks for it;
    whether it did."""
    if not wanted(environ):
        return False
    start(service)
    return True


def start(service: str, *, endpoint: str | None = None) -> None:
    """Start tracing: spans batched and exported over OTLP/HTTP to
    ``endpoint`` (the whole URL, ``.../v1/traces``), or where the
    ``OTEL_EXPORTER_OTLP_*`` variables say. The sampler is
    ``OTEL_TRACES_SAMPLER``'s (default: parent-based, always on)."""
    global _provider, _tracer
    # Imported here: a process that does not trace never loads the SDK.
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import SERVICE_NAME, Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    shutdown()
    resource = Resource.create()
    if str(resource.attributes.get(SERVICE_NAME, "")).startswith("unknown_service"):
        resource = resource.merge(Resource({SERVICE_NAME: service}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint)))
    _provider, _tracer = provider, provider.get_tracer("hooklane")
    logger.info("tracing on: spans exported over OTLP/HTTP", extra={"action": "tracing"})


def shutdown() -> None:
    """Export the spans still batched and stop tracing (a no-op when off)."""
    global _provider, _tracer
    provider, _provider, _tracer = _provider, None, None
    if provider is not None:
        provider.shutdown()


def enabled() -> bool:
    return _tracer is not None


def _started() -> trace.Tracer:
    assert _tracer is not None, "a span made while tracing is off: guard it with enabled()"
    return _tracer


# --------------------------------------------------------------------------
# Contexts and traceparent values


def traceparent_of(span_context: SpanContext) -> str | None:
    """A span context as a traceparent value; None for the invalid one (no span)."""
    if not span_context.is_valid:
        return None
    return format_traceparent(span_context.trace_id, span_context.span_id, span_context.trace_flags)


def current_traceparent() -> str | None:
    """The caller's current OpenTelemetry context as a traceparent, made by
    whatever tracer provider (the application's own): None outside a span."""
    return traceparent_of(trace.get_current_span().get_span_context())


def context_of(traceparent: str | None) -> Context | None:
    """The context whose remote parent ``traceparent`` names; None without
    one, or for a stored value that is not one (written behind the
    publisher's back): the span then starts a trace of its own."""
    if traceparent is None:
        return None
    try:
        parsed = parse_traceparent(traceparent, "traceparent")
    except InvalidInput:
        return None
    parent = SpanContext(
        int(parsed.trace_id, 16),
        int(parsed.span_id, 16),
        is_remote=True,
        trace_flags=OtelTraceFlags(parsed.flags),
    )
    return trace.set_span_in_context(NonRecordingSpan(parent))


def trace_id_of(traceparent: str | None) -> str | None:
    """The trace id (32 hex digits) of a checked traceparent."""
    return None if traceparent is None else traceparent[3:35]


def exemplar(span: Span | None) -> dict[str, str] | None:
    """A metric exemplar naming ``span``'s trace, when it is sampled (an
    unsampled trace is nowhere to be found)."""
    if span is None:
        return None
    context = span.get_span_context()
    return {"trace_id": f"{context.trace_id:032x}"} if context.trace_flags.sampled else None


# --------------------------------------------------------------------------
# The spans


def internal(
    name: str, parent: str | None = None, **attributes: str | int
) -> AbstractContextManager[Span | None]:
    """An INTERNAL span around a block, made current, child of ``parent``
    (a checked traceparent) or of the current span; its ``attributes``
    under ``hooklane.``. ``None`` and no span when tracing is off."""
    if _tracer is None:
        return _NO_SPAN
    return _tracer.start_as_current_span(
        name,
        context=context_of(parent),
        attributes={f"hooklane.{key}": value for key, value in attributes.items()},
    )


@contextmanager
def ingest_span(route: str, parent: str | None) -> Iterator[Span]:
    """The API's SERVER span of one ingest request, child of the producer's
    ``parent`` (its traceparent header) and made current: what the events
    are stored under."""
    with _started().start_as_current_span(
        f"POST {route}",
        context=context_of(parent),
        kind=SpanKind.SERVER,
        attributes={"http.request.method": "POST", "http.route": route},
    ) as span:
        yield span


def answered(span: Span, status: int) -> None:
    span.set_attribute("http.response.status_code", status)
    if status >= 500:
        span.set_status(Status(StatusCode.ERROR))


def attempt_span(
    *,
    parent: str | None,
    endpoint: str,
    tenant: str,
    attempt: int,
    host: str,
    delivery_id: int,
    event_id: str,
    reserved_in: SpanContext | None,
) -> Span:
    """The CLIENT span of one delivery attempt, child of the event's stored
    ``parent`` (a trace of its own without one), linked to the reservation
    round that handed it out. Not made current: the attempt's call needs no
    context but the header it sends."""
    return _started().start_span(
        "webhook deliver",
        context=context_of(parent),
        kind=SpanKind.CLIENT,
        attributes={
            "hooklane.endpoint": endpoint,
            "hooklane.tenant": tenant,
            "hooklane.attempt": attempt,
            "hooklane.delivery_id": delivery_id,
            "hooklane.event_id": event_id,
            "http.request.method": "POST",
            "server.address": host,
        },
        links=None if reserved_in is None else [Link(reserved_in)],
    )


def attempted(span: Span, result: Result) -> None:
    """End an attempt's span with what it did: the HTTP status or the
    failure class, the outcome, and ERROR unless delivered."""
    if result.status is not None:
        span.set_attribute("http.response.status_code", result.status)
    if result.failure is not None:
        span.set_attribute("hooklane.failure", str(result.failure))
    span.set_attribute("hooklane.outcome", str(result.outcome))
    if result.outcome is not ResultOutcome.DELIVERED:
        span.set_status(Status(StatusCode.ERROR, result.error))
    span.end()

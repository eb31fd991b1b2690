"""The W3C traceparent value (hooklane/traceparent.py) and which environment
turns tracing on (hooklane/tracing.py: wanted): pure, no SDK set up."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hooklane.errors import InvalidInput
from hooklane.traceparent import TraceParent, format_traceparent, parse_traceparent
from hooklane.tracing import context_of, trace_id_of, wanted

GOOD = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_good_value_reads_back_as_it_came():
    parsed = parse_traceparent(GOOD, "traceparent")
    assert parsed == TraceParent("4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7", 1)
    assert parsed.sampled and str(parsed) == GOOD
    assert trace_id_of(GOOD) == "4bf92f3577b34da6a3ce929d0e0e4736"


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("01" + GOOD[2:], "must be a W3C traceparent"),  # another version
        (GOOD.upper(), "must be a W3C traceparent"),
        (GOOD + "-00", "must be a W3C traceparent"),  # a later version's extra field
        (GOOD[:-1], "must be a W3C traceparent"),
        (" " + GOOD, "must be a W3C traceparent"),
        ("00-" + "0" * 32 + "-00f067aa0ba902b7-01", "all-zero trace id"),
        ("00-4bf92f3577b34da6a3ce929d0e0e4736-" + "0" * 16 + "-01", "all-zero parent span id"),
        ("", "must be a W3C traceparent"),
        (42, "must be a W3C traceparent text"),
    ],
)
def test_anything_else_is_refused_naming_the_field(value, words):
    with pytest.raises(InvalidInput) as refused:
        parse_traceparent(value, "the-field")
    assert refused.value.field == "the-field"
    assert words in refused.value.message


@given(
    st.integers(1, 2**128 - 1),
    st.integers(1, 2**64 - 1),
    st.integers(0, 255),
)
def test_what_is_formatted_parses_back(trace_id, span_id, flags):
    text = format_traceparent(trace_id, span_id, flags)
    parsed = parse_traceparent(text, "traceparent")
    assert (int(parsed.trace_id, 16), int(parsed.span_id, 16), parsed.flags) == (trace_id, span_id, flags)
    assert str(parsed) == text


@given(st.text(max_size=60))
def test_any_text_is_either_a_traceparent_or_refused(text):
    try:
        parsed = parse_traceparent(text, "traceparent")
    except InvalidInput as exc:
        assert exc.field == "traceparent"
    else:
        assert str(parsed) == text


def test_a_stored_value_becomes_a_remote_parent_and_a_bad_one_none():
    from opentelemetry import trace

    context = context_of(GOOD)
    assert context is not None
    parent = trace.get_current_span(context).get_span_context()
    assert (
        parent.is_remote and format_traceparent(parent.trace_id, parent.span_id, parent.trace_flags) == GOOD
    )
    assert context_of(None) is None and context_of("00-junk") is None


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": " otlp "}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_SDK_DISABLED": "false"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}, True),
    ],
)
def test_tracing_is_on_only_when_asked_for(environ, on):
    assert wanted(environ) is on


@pytest.mark.parametrize(
    ("environ", "variable"),
    [
        ({"OTEL_TRACES_EXPORTER": "console"}, "OTEL_TRACES_EXPORTER"),
        ({"OTEL_TRACES_EXPORTER": "otlp,console"}, "OTEL_TRACES_EXPORTER"),
        (
            {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"},
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ),
        (
            {
                "OTEL_TRACES_EXPORTER": "otlp",
                "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc",
                "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            },
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        ),
    ],
)
def test_what_cannot_be_exported_is_refused_naming_the_variable(environ, variable):
    with pytest.raises(InvalidInput) as refused:
        wanted(environ)
    assert refused.value.field == variable

"""Settings are read once from the environment and checked whole: a bad
value names its variable, before anything starts (a process:
tests/processes/test_settings.py)."""

from __future__ import annotations

import dataclasses
import logging
from ipaddress import ip_network

import pytest

from hooklane.errors import InvalidInput
from hooklane.policies import CircuitPolicy, RetryPolicy
from hooklane.settings import Settings
from testsupport import timings


def test_defaults_are_the_contracts():
    settings = Settings.from_env({})
    assert settings.retry == RetryPolicy(30.0, 6 * 3600.0, 20, 72 * 3600.0)
    assert settings.circuit == CircuitPolicy(20, 60.0, 3600.0)
    assert settings.worker_concurrency == 256
    # A worker and the API on one machine do not take the same port.
    assert (settings.metrics_port_of("worker"), settings.metrics_port_of("api")) == (9100, 9101)
    # nothing beyond globally routable addresses unless allowed
    assert settings.allowed_networks == ()


def test_values_are_read_and_typed():
    settings = Settings.from_env(
        {
            "HOOKLANE_DATABASE_URL": "postgresql://db/hooklane",
            "HOOKLANE_WORKER_CONCURRENCY": "32",
            "HOOKLANE_POLL_SECONDS": "0.25",
            "HOOKLANE_METRICS_PORT": "0",
            "HOOKLANE_RETRY_MAX_ATTEMPTS": "5",
            "HOOKLANE_CIRCUIT_STEP_SECONDS": "10",
            "HOOKLANE_ALLOWED_NETWORKS": "127.0.0.0/8, ::1/128,10.20.0.0/16",
        }
    )
    assert settings.database_url == "postgresql://db/hooklane"
    assert (settings.worker_concurrency, settings.poll_seconds) == (32, 0.25)
    assert settings.metrics_port_of("worker") == settings.metrics_port_of("api") == 0
    assert settings.retry.max_attempts == 5 and settings.circuit.step_seconds == 10.0
    assert settings.allowed_networks == (
        ip_network("127.0.0.0/8"),
        ip_network("::1/128"),
        ip_network("10.20.0.0/16"),
    )


@pytest.mark.parametrize(
    "variable, value",
    [
        ("HOOKLANE_WORKER_CONCURRENCY", "0"),
        ("HOOKLANE_WORKER_CONCURRENCY", "-4"),
        ("HOOKLANE_WORKER_CONCURRENCY", "2.5"),
        ("HOOKLANE_WORKER_CONCURRENCY", "9" * 5000),
        ("HOOKLANE_RESERVE_BATCH", "0"),
        ("HOOKLANE_TENANT_MAX_IN_FLIGHT", "0"),
        ("HOOKLANE_TENANT_MAX_IN_FLIGHT", "none"),
        ("HOOKLANE_POLL_SECONDS", "0"),
        ("HOOKLANE_POLL_SECONDS", "-1"),
        ("HOOKLANE_POLL_SECONDS", "nan"),
        ("HOOKLANE_POLL_SECONDS", "inf"),
        ("HOOKLANE_POLL_SECONDS", "soon"),
        ("HOOKLANE_LEASE_GRACE_SECONDS", "NaN"),
        ("HOOKLANE_DRAIN_SECONDS", "-1"),
        ("HOOKLANE_OPERATOR_STATUS_SECONDS", "0"),
        ("HOOKLANE_METRICS_PORT", "65536"),
        ("HOOKLANE_METRICS_PORT", "-1"),
        ("HOOKLANE_METRICS_PORT", "http"),
        ("HOOKLANE_METRICS_HOST", ""),
        ("HOOKLANE_RETRY_BASE_SECONDS", "0"),
        ("HOOKLANE_RETRY_MAX_ATTEMPTS", "0"),
        ("HOOKLANE_CIRCUIT_THRESHOLD", "0"),
        ("HOOKLANE_CIRCUIT_CAP_SECONDS", "nan"),
        ("HOOKLANE_ALLOWED_NETWORKS", "10.0.0.1/8"),
        ("HOOKLANE_ALLOWED_NETWORKS", "localhost"),
        ("HOOKLANE_ALLOWED_NETWORKS", "127.0.0.0/8 ::1/128"),
        ("HOOKLANE_ALLOWED_NETWORKS", "10.0.0.0/8," + "9" * 5000),
    ],
)
def test_a_bad_value_is_refused_naming_its_variable(variable, value):
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({variable: value})
    assert refused.value.field == variable
    assert len(str(refused.value)) < 200


def test_a_rule_between_two_values_names_both():
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({"HOOKLANE_RETRY_CAP_SECONDS": "10"})
    assert refused.value.field == "HOOKLANE_RETRY_*"
    assert "cap_seconds (10) must be at least base_seconds (30)" in refused.value.message


def test_a_bad_network_is_named_as_written():
    with pytest.raises(InvalidInput) as refused:
        Settings.from_env({"HOOKLANE_ALLOWED_NETWORKS": "127.0.0.0/8,10.0.0.1/8"})
    assert (
        str(refused.value)
        == "HOOKLANE_ALLOWED_NETWORKS: '10.0.0.1/8' has host bits set: the network is 10.0.0.0/8"
    )


def test_settings_built_in_code_are_checked_too():
    with pytest.raises(ValueError):
        Settings(poll_seconds=0)
    with pytest.raises(ValueError):
        dataclasses.replace(Settings(), worker_concurrency=0)
    with pytest.raises(ValueError):
        CircuitPolicy(threshold=0)
    with pytest.raises(ValueError):
        Settings(allowed_networks="10.0.0.1/8")


def test_an_unknown_variable_is_named_in_a_warning(caplog):
    with caplog.at_level(logging.WARNING, logger="hooklane.settings"):
        Settings.from_env({"HOOKLANE_WORKER_CONCURENCY": "8", "OTHER": "x", "HOOKLANE_CLUSTER_DIR": "/tmp/c"})
    assert [r.getMessage() for r in caplog.records] == [
        "HOOKLANE_WORKER_CONCURENCY is not a Hooklane setting; ignored"
    ]


def test_the_tests_timings_reach_a_process_as_they_reach_settings():
    timed = {**timings.WORKER, **timings.OPERATOR}
    read = Settings.from_env(timings.environment(timed))
    assert {name: getattr(read, name) for name in timed} == timed
    assert all(getattr(Settings(), name) != seconds for name, seconds in timed.items())

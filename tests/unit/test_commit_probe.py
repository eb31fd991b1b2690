"""The commit probe's pure rules (issue 38): its interval follows the rate
events come at, the observed rate forgets, and a probe is worth running
only once a transaction ended."""

from __future__ import annotations

import pytest

from hooklane.worker.commits import RATE_MEMORY_SECONDS, ended_since, next_interval, observed_rate


def test_the_probe_interval_follows_the_rate_events_come_at():
    # sqrt(rate * pace) probes a second: one per event at the pace, more
    # below it, fewer above it
    assert next_interval(100.0, 100.0, 0.005, 10.0) == pytest.approx(0.01)
    assert next_interval(10.0, 100.0, 0.005, 10.0) == pytest.approx(1 / 1000**0.5)
    assert next_interval(1.0, 100.0, 0.005, 10.0) == pytest.approx(0.1)
    # no shorter than the shortest, however fast events come
    assert next_interval(5000.0, 100.0, 0.005, 10.0) == 0.005
    # none found lately: the longest
    assert next_interval(0.0, 100.0, 0.005, 10.0) == 10.0
    assert next_interval(1e-5, 100.0, 0.005, 10.0) == 10.0
    # a longest shorter than the rate asks (settings changed) wins
    assert next_interval(0.001, 100.0, 0.005, 1.0) == 1.0
    # a slower pace: longer intervals
    assert next_interval(100.0, 25.0, 0.005, 10.0) == pytest.approx(0.02)


def test_the_observed_rate_counts_what_was_found_and_forgets_it():
    assert observed_rate(0.0, 0.1, 3) == pytest.approx(3 / RATE_MEMORY_SECONDS)
    # events every 100 ms settle near 10/s
    rate = 0.0
    for _ in range(100):
        rate = observed_rate(rate, 0.1, 1)
    assert 9.0 < rate < 11.5
    # none found for a while: it decays towards nothing, and the probe
    # backs off to its longest
    quiet = observed_rate(rate, 10 * RATE_MEMORY_SECONDS, 0)
    assert quiet < 0.001
    assert next_interval(quiet, 100.0, 0.005, 10.0) > 1.0
    assert next_interval(observed_rate(rate, 20 * RATE_MEMORY_SECONDS, 0), 100.0, 0.005, 10.0) == 10.0


def test_a_probe_is_worth_running_only_once_a_transaction_ended():
    assert ended_since(None, "10:12:10,11")
    # nothing began or ended
    assert not ended_since("10:12:10,11", "10:12:10,11")
    # began since, still running
    assert not ended_since("10:12:10,11", "10:14:10,11,12,13")
    # one running then ended
    assert ended_since("10:12:10,11", "11:12:11")
    # one begun since ended
    assert ended_since("10:12:10,11", "10:14:10,11,13")

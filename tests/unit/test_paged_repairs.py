"""The paged repairs' pure rules: the shares of the API's pool are refused
by name when they do not fit it and follow it when unset, and a page starts
only when twice the slowest fits before the stop. On a real Postgres:
tests/db/test_paged_repairs.py."""

from __future__ import annotations

import pytest

from hooklane.api.shares import Sizes, share_sizes
from hooklane.errors import InvalidInput
from hooklane.settings import Settings
from hooklane.store.deliveries import another_page_fits

# --- replays that stop and continue --------------------------------------------


# --- resend and discard of every dead delivery ---------------------------------


# --- the pool's shares -----------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "variable"),
    [
        ({"api_pool_size": 4, "api_pool_ingest_reserved": 4}, "HOOKLANE_API_POOL_INGEST_RESERVED"),
        (
            {"api_pool_size": 10, "api_pool_ingest_reserved": 4, "api_pool_tenant_max": 7},
            "HOOKLANE_API_POOL_TENANT_MAX",
        ),
    ],
)
def test_shares_that_do_not_fit_the_pool_are_refused_by_name(changes, variable):
    with pytest.raises(InvalidInput) as refused:
        share_sizes(Settings(**changes))
    assert refused.value.field == variable


@pytest.mark.parametrize(
    ("changes", "sizes"),
    [
        ({}, Sizes(4, 3)),
        ({"api_pool_size": 2}, Sizes(1, 1)),
        ({"api_pool_size": 5}, Sizes(4, 1)),
        ({"api_pool_size": 30}, Sizes(4, 13)),
        ({"api_pool_size": 10, "api_pool_ingest_reserved": 2}, Sizes(2, 4)),
        ({"api_pool_size": 10, "api_pool_ingest_reserved": 4, "api_pool_tenant_max": 6}, Sizes(4, 6)),
    ],
)
def test_unset_shares_follow_the_pool(changes, sizes):
    assert share_sizes(Settings(**changes)) == sizes


def test_a_page_starts_only_when_twice_the_slowest_fits_before_the_stop():
    assert another_page_fits(10.0, None, 100.0)
    assert another_page_fits(10.0, 10.5, 0.25)
    assert not another_page_fits(10.0, 10.5, 0.26)

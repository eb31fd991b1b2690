"""The admin API's OpenAPI document agrees with the store: its enums and
its status pattern."""

from __future__ import annotations

import re

import pytest

from hooklane import store
from hooklane.errors import InvalidInput
from testsupport.api_admin import openapi_document


def test_the_documents_enums_are_the_stores():
    schemas = openapi_document()["components"]["schemas"]
    assert tuple(schemas["AttemptOutcome"]["enum"]) == store.OUTCOMES
    assert tuple(schemas["FailureClass"]["enum"]) == store.FAILURES
    assert tuple(schemas["AdminDelivery"]["properties"]["state"]["enum"]) == store.STATES


@pytest.mark.parametrize(
    "text", ["503", "5xx", "1xx", "199", "599", "5XX", "600", "099", "50", "5000", "x5x", ""]
)
def test_the_documents_status_pattern_is_the_stores_rule(text):
    pattern = openapi_document()["components"]["schemas"]["StatusFilter"]["pattern"]
    try:
        store.check_status_filter(text)
        taken = True
    except InvalidInput:
        taken = False
    assert (re.search(pattern, text) is not None) == taken

"""The Helm chart (charts/hooklane) read as files: its metadata follows the
Python package, its CRDs are the repository's, its values schema takes the
token entries the API takes."""

from __future__ import annotations

import json
import re
import tomllib

import pytest
import yaml

from hooklane.errors import InvalidInput
from hooklane.tokens import Tokens
from testsupport.chart import CHART, ROOT


def test_chart_metadata_follows_the_python_package():
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]
    assert chart["apiVersion"] == "v2"
    assert chart["name"] == "hooklane"
    assert chart["appVersion"] == version
    assert chart["kubeVersion"] == ">=1.29.0-0"


def test_the_crds_are_the_repositorys_own():
    link = CHART / "crds"
    assert link.is_symlink() and link.resolve() == (ROOT / "crds").resolve()


@pytest.mark.parametrize(
    "entry",
    [
        "a" * 16,
        "A-Z_a.z~0+9/=-" + "x" * 2,
        "x" * 512,
        "t" * 20 + " tenants=acme",
        "t" * 20 + "  tenants=acme,globex.example",
        "t" * 20 + " tenants=a=b,#c",
        "t" * 15,
        "x" * 513,
        "t" * 19 + "#",
        "t" * 19 + ",",
        "t" * 20 + ",acme",
        # The syntax before tenants=: refused, not misread.
        "t" * 20 + " acme",
        "t" * 20 + " acme globex",
        "t" * 20 + " acme,globex-corporation-eu",
        "t" * 20 + " ,acme",
        "t" * 20 + " tenants=",
        "t" * 20 + " tenants=acme,",
        "t" * 20 + " tenants=acme,,globex",
        "t" * 20 + " tenants=acme tenants=globex",
        "t" * 20 + " tenants=ac\u2028me",
        "t" * 20 + " tenant=acme",
        "t" * 20 + " ",
        " " + "t" * 20,
        "t" * 20 + "\n" + "u" * 20,
    ],
)
def test_the_schema_takes_the_token_entries_the_api_takes(entry):
    """values.schema.json checks token entries at install time; it must take
    exactly what hooklane/tokens.py takes as one entry of a file (one
    line, without the spaces around it the API would forgive)."""
    schema = json.loads((CHART / "values.schema.json").read_text())
    pattern = schema["definitions"]["tokenEntries"]["items"]["pattern"]
    try:
        parsed = len(Tokens.parse(entry, "entry")) == 1
    except InvalidInput:
        parsed = False
    parsed = parsed and entry == entry.strip()
    assert bool(re.search(pattern, entry)) == parsed, entry

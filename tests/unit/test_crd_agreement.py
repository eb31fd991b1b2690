"""Every delivery field of the CRD is described for ``kubectl explain``."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import yaml

from hooklane.crd import CRD_NAME, openapi
from hooklane.dev.controlplane import CRD_DIR
from hooklane.spec import (
    DELIVERY,
)


def _described(schema: dict[str, Any], path: str) -> Iterator[tuple[str, bool]]:
    """Every field under ``schema`` (its properties and its items'), and
    whether it has a description."""
    for key, child in schema.get("properties", {}).items():
        yield f"{path}.{key}", bool(child.get("description", "").strip())
        yield from _described(child, f"{path}.{key}")
    if "items" in schema:
        yield from _described(schema["items"], f"{path}[]")


def test_every_delivery_field_is_described_for_kubectl_explain():
    """`kubectl explain webhookendpoints.spec.delivery --recursive` shows the
    descriptions the API server publishes from the CRD's schema."""
    found = []
    for path in sorted(CRD_DIR.glob("*.yaml")):
        for crd in yaml.safe_load_all(path.read_text()):
            if not crd or crd["metadata"]["name"] != CRD_NAME:
                continue
            for version in crd["spec"]["versions"]:
                spec = version["schema"]["openAPIV3Schema"]["properties"]["spec"]
                found += list(
                    _described({"properties": {"delivery": spec["properties"]["delivery"]}}, "spec")
                )
    assert len(found) >= len(list(_described({"properties": {"delivery": openapi(DELIVERY)}}, "spec"))) > 20
    assert [field for field, described in found if not described] == []

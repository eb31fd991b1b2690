"""The test control plane itself, and the WebhookEndpoint CRD served by it."""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import kubernetes
import pytest
import yaml

from hooklane.crd import CRD_NAME
from hooklane.dev.controlplane import ControlPlane
from testsupport.kube_fixtures import WHE_COLUMNS

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"

SpecEdit = Callable[[dict[str, Any]], None]


def endpoint_manifest(name: str = "orders-acme") -> dict[str, Any]:
    manifest = yaml.safe_load((EXAMPLES / "endpoint.yaml").read_text())
    manifest["metadata"]["name"] = name
    return manifest


def test_kubectl_reaches_a_stamped_apiserver(control_plane: ControlPlane) -> None:
    version = json.loads(control_plane.kubectl("version", "-o", "json").stdout)
    # Without the build's ldflags the server would report v0.0.0-master.
    assert re.fullmatch(r"v1\.\d+\.\d+", version["serverVersion"]["gitVersion"])
    assert control_plane.kubectl("auth", "can-i", "*", "*").stdout.strip() == "yes"


def test_kubeconfig_works_for_the_python_client(kubeconfig: Path) -> None:
    api = kubernetes.client.ApiextensionsV1Api(
        kubernetes.config.new_client_from_config(config_file=str(kubeconfig))
    )
    crd = api.read_custom_resource_definition(CRD_NAME)
    established = {c.type: c.status for c in crd.status.conditions}["Established"]
    assert established == "True"


def test_examples_apply_and_show_the_printer_columns(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    for example in ("secret.yaml", "endpoint.yaml"):
        control_plane.kubectl("apply", "-n", kube_namespace, "-f", str(EXAMPLES / example))

    table = control_plane.kubectl("get", "whe", "-n", kube_namespace).stdout.splitlines()
    assert table[0].split() == WHE_COLUMNS
    assert table[1].split()[:4] == ["orders-acme", "acme", "http://127.0.0.1:9000/hooks/acme", "4"]


def test_status_subresource_feeds_the_columns_and_keeps_operator_fields(
    control_plane: ControlPlane, kube_namespace: str
) -> None:
    control_plane.kubectl("create", "-n", kube_namespace, "-f", "-", stdin=json.dumps(endpoint_manifest()))
    status = {
        "phase": "Paused",
        "pending": 12,
        "oldestPendingAgeSeconds": 345,
        "conditions": [
            {
                "type": "Ready",
                "status": "False",
                "reason": "SecretMissing",
                "message": "secret acme-webhook-secret not found",
                "observedGeneration": 1,
                "lastTransitionTime": "2026-01-01T00:00:00Z",
            }
        ],
        "kopf": {"progress": {}},
    }
    control_plane.kubectl(
        "patch",
        "-n",
        kube_namespace,
        "whe",
        "orders-acme",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )

    row = control_plane.kubectl("get", "whe", "-n", kube_namespace, "--no-headers").stdout.split()
    assert row[4:7] == ["Paused", "12", "345"]
    stored = json.loads(
        control_plane.kubectl("get", "whe", "-n", kube_namespace, "orders-acme", "-o", "json").stdout
    )
    assert stored["status"]["kopf"] == {"progress": {}}


def test_defaults_are_applied(control_plane: ControlPlane, kube_namespace: str) -> None:
    manifest = endpoint_manifest("minimal")
    del manifest["spec"]["maxConcurrency"], manifest["spec"]["eventTypes"]
    control_plane.kubectl("create", "-n", kube_namespace, "-f", "-", stdin=json.dumps(manifest))

    stored = json.loads(
        control_plane.kubectl("get", "whe", "-n", kube_namespace, "minimal", "-o", "json").stdout
    )
    assert stored["spec"]["maxConcurrency"] == 4
    assert stored["spec"]["timeoutSeconds"] == 5
    assert stored["spec"]["paused"] is False


def _without(field: str) -> SpecEdit:
    def edit(spec: dict[str, Any]) -> None:
        del spec[field]

    return edit


def _with(field: str, value: Any) -> SpecEdit:
    def edit(spec: dict[str, Any]) -> None:
        spec[field] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            _with("url", "ftp://example.com/hooks"),
            'spec.url: Invalid value: "ftp://example.com/hooks": must be an absolute http:// or https:// URL',
        ),
        (_with("url", "not a url"), "spec.url: Invalid value"),
        (_with("maxConcurrency", 0), "spec.maxConcurrency in body should be greater than or equal to 1"),
        (_with("maxConcurrency", 300), "spec.maxConcurrency in body should be less than or equal to 256"),
        (_with("timeoutSeconds", 61), "spec.timeoutSeconds in body should be less than or equal to 60"),
        (_with("eventTypes", ["order..created"]), "spec.eventTypes[0] in body should match"),
        (_with("eventTypes", ["order.*.paid"]), "spec.eventTypes[0] in body should match"),
        (_with("secretRef", {"name": "acme-webhook-secret"}), "spec.secretRef.key: Required value"),
        (_without("tenant"), "spec.tenant: Required value"),
        (_without("url"), "spec.url: Required value"),
    ],
    ids=[
        "ftp-url",
        "not-a-url",
        "concurrency-0",
        "concurrency-300",
        "timeout-61",
        "empty-event-segment",
        "inner-wildcard",
        "secret-key-missing",
        "tenant-missing",
        "url-missing",
    ],
)
def test_invalid_manifests_are_refused(
    control_plane: ControlPlane, kube_namespace: str, edit: SpecEdit, expected: str
) -> None:
    manifest = endpoint_manifest("invalid")
    edit(manifest["spec"])

    done = control_plane.kubectl(
        "create", "-n", kube_namespace, "-f", "-", stdin=json.dumps(manifest), check=False
    )

    assert done.returncode != 0
    assert 'The WebhookEndpoint "invalid" is invalid' in done.stderr
    assert expected in done.stderr
    assert control_plane.kubectl("get", "whe", "-n", kube_namespace, "-o", "name").stdout == ""

"""The Helm chart (charts/hooklane) installed against a real kube-apiserver:
with its CRDs, and with every option the API server must accept."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import Iterator

import pytest
import yaml

from hooklane.dev.controlplane import ControlPlane
from testsupport.chart import CHART, EVERYTHING, REQUIRED, ROOT


@pytest.fixture(scope="module")
def bare_control_plane() -> Iterator[ControlPlane]:
    """A control plane without the CRDs, so that Helm installs them."""
    with ControlPlane(crd_dir=None) as cp:
        yield cp


def test_helm_installs_the_chart_with_its_crds(tools, bare_control_plane):
    cp = bare_control_plane
    env = {**tools.env, "KUBECONFIG": str(cp.kubeconfig)}
    namespace = f"hooklane-{uuid.uuid4().hex[:8]}"
    cp.create_namespace(namespace)
    # No hooks: no controller manager runs here, so the migration Job would
    # never finish. Its objects are checked by the dry run below.
    done = subprocess.run(
        [
            str(tools.folder / "helm"),
            "install",
            "hooklane",
            str(CHART),
            "--namespace",
            namespace,
            "--no-hooks",
            *REQUIRED,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert 'kubectl -n "$NS" get whe' in done.stdout  # the NOTES
    cp.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=30s",
        "crd/webhookendpoints.hooklane.io",
        "crd/webhookeventtypes.hooklane.io",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
    )
    assert cp.kubectl("get", "clusterkopfpeering", "hooklane", "-o", "name").stdout.strip()
    deployments = cp.kubectl("-n", namespace, "get", "deployments", "-o", "name").stdout.split()
    assert sorted(deployments) == [
        "deployment.apps/hooklane-api",
        "deployment.apps/hooklane-operator",
        "deployment.apps/hooklane-worker",
    ]
    # The example endpoints pass the installed CRD's validation.
    for example in ("endpoint.yaml", "endpoint-delivery.yaml", "eventtypes/order-paid.yaml"):
        cp.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", str(ROOT / "examples" / example))
    hooks = tools.helm(
        "template",
        "hooklane",
        str(CHART),
        "--namespace",
        namespace,
        "--show-only",
        "templates/migration-job.yaml",
        *REQUIRED,
    ).stdout
    cp.kubectl("-n", namespace, "apply", "--dry-run=server", "-f", "-", stdin=hooks)


def test_the_api_server_accepts_every_option(tools, bare_control_plane):
    cp = bare_control_plane
    # The CRDs come with the chart (Helm installs them; here by hand).
    crds = [d for d in tools.render("--include-crds", *REQUIRED) if d["kind"] == "CustomResourceDefinition"]
    cp.kubectl("apply", "--server-side", "-f", "-", stdin=yaml.safe_dump_all(crds))
    cp.kubectl("wait", "--for=condition=Established", "--timeout=30s", "crd/kopfpeerings.kopf.dev")
    for namespace in ("hooklane", "shop", "billing"):
        if cp.kubectl("get", "namespace", namespace, check=False).returncode != 0:
            cp.create_namespace(namespace)
    # The Prometheus Operator's CRDs are not in this control plane; their two
    # objects are checked by promtool and the unit tests instead.
    docs = [
        d
        for d in tools.render("-f", str(EVERYTHING))
        if not d["apiVersion"].startswith("monitoring.coreos.com/")
    ]
    done = cp.kubectl("apply", "--dry-run=server", "-f", "-", stdin=yaml.safe_dump_all(docs))
    assert done.stdout.count("(server dry run)") == len(docs), done.stdout

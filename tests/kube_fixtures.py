"""pytest fixtures for tests against a real kube-apiserver.

Load with ``pytest_plugins = ["tests.kube_fixtures"]`` and mark such tests
``@pytest.mark.kube``. One control plane (etcd + kube-apiserver, CRDs
installed) serves the whole session; the first run on a machine builds the
binaries, which takes minutes (see hack/envtest/README.md).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from hooklane.dev.controlplane import ControlPlane


@pytest.fixture(scope="session")
def control_plane() -> Iterator[ControlPlane]:
    with ControlPlane() as cp:
        yield cp


@pytest.fixture(scope="session")
def kubeconfig(control_plane: ControlPlane) -> Path:
    return control_plane.kubeconfig


@pytest.fixture
def kube_namespace(control_plane: ControlPlane, request: pytest.FixtureRequest) -> str:
    """A new namespace per test, named after the test for easier debugging.

    Never deleted: with no controller manager a deleted namespace stays
    Terminating forever, and the control plane is thrown away anyway.
    """
    stem = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:50].rstrip("-")
    name = f"{stem}-{uuid.uuid4().hex[:8]}"
    control_plane.create_namespace(name)
    return name

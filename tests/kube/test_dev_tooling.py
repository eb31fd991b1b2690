"""The dev tooling's control plane never outlives it: ``hooklane dev
controlplane`` killed leaves no kube-apiserver behind."""

from __future__ import annotations

import sys
from pathlib import Path

from testsupport.dev_tooling import killed_after_it_printed, wait_gone


def test_a_killed_dev_controlplane_leaves_no_apiserver_behind():
    folder, pids = killed_after_it_printed(
        [sys.executable, "-m", "hooklane.dev.controlplane"], lambda kubeconfig: str(Path(kubeconfig).parent)
    )
    assert pids, "etcd and kube-apiserver were running"
    wait_gone(pids, folder)

"""hooklane.kube: the login and the paths the operator and the API's
endpoint writer share. Their calls against a real API server are in
tests/kube/test_operator.py and tests/kube/test_selfservice_kubernetes.py."""

import importlib.util

import kopf
import pytest

from hooklane import kube
from hooklane.crd import GROUP, PLURAL, VERSION


def test_the_paths_are_kopfs() -> None:
    endpoints = kopf.Resource(GROUP, VERSION, PLURAL, namespaced=True, subresources=frozenset({"status"}))
    secrets = kopf.Resource("", "v1", "secrets", namespaced=True)
    for namespace, name in [("shop", ""), ("shop", "orders")]:
        assert kube.endpoints_path(namespace, name) == endpoints.get_url(
            namespace=namespace, name=name or None
        )
        assert kube.secrets_path(namespace, name) == secrets.get_url(namespace=namespace, name=name or None)
    assert kube.endpoints_path("shop", "orders", "status") == endpoints.get_url(
        namespace="shop",
        name="orders",
        subresource="status",
    )


@pytest.mark.parametrize(
    ("host", "port", "server"),
    [
        ("10.96.0.1", "443", "https://10.96.0.1:443"),
        ("fd00::1", "6443", "https://[fd00::1]:6443"),
        ("", "", "https://kubernetes.default.svc"),
    ],
)
def test_in_a_pod_the_api_server_is_the_address_kubelet_gives(
    host: str, port: str, server: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    def service_account(**_: object) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server="https://kubernetes.default.svc", token="t")

    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    monkeypatch.setattr(kopf, "login_with_service_account", service_account)
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", host)
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", port)
    # The operator's, without the kubernetes package, and the API's.
    for login in (kube.login, kube.plain_login):
        info = login(settings=kopf.OperatorSettings())
        assert info is not None and (info.server, info.token) == (server, "t")

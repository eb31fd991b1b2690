"""The kube tier (pyproject.toml's markers): needs the envtest control plane
(kube-apiserver and etcd built from hack/envtest)."""

from tests.tiers import folder

pytest_itemcollected = folder("kube")

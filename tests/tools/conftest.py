"""The tools tier (pyproject.toml's markers): runs helm, the helm-unittest
plugin and promtool, built from their Go modules by hack/tools/build."""

from tests.tiers import folder

pytest_itemcollected = folder("tools")

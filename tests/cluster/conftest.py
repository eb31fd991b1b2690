"""The cluster tier (pyproject.toml's markers): end to end on a real single-
node cluster (hack/cluster, as root), the image (hack/image) and the
chart."""

from tests.tiers import folder

pytest_itemcollected = folder("cluster")

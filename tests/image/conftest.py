"""The image tier (pyproject.toml's markers): runs the container image
(hack/image) with podman: every role, non-root, read-only root
filesystem."""

from tests.tiers import folder

pytest_itemcollected = folder("image")

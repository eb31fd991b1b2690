"""Developer tooling: a local Kubernetes control plane for tests and trying Hooklane."""

"""What tests and benchmarks share: receivers, certificates, the chaos
harness, fixtures, timers. It imports neither tests/ nor bench/."""

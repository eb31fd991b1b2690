"""One-off measurements: each answered one question of one issue, and
docs/benchmarks.md quotes its results as past figures. Kept to be read and
rerun by hand, not maintained: no smoke test runs them, and they may need
the tree they were written against (each names it)."""

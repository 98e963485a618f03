"""Benchmarks a user can rerun: `python -m stash.bench.fit`."""

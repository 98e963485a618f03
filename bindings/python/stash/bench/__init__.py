"""Benchmarks a user can rerun: `python -m stash.bench.fit`, `python -m stash.bench.peers`."""

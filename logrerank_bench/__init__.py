"""Benchmarks that use only the public library API (see `logrerank_bench/protocol.py` for the rules)."""

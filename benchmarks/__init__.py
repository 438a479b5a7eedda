"""Benchmarks that use only the public library API (see `benchmarks/protocol.py` for the rules)."""

"""logrerank_jax.graph."""

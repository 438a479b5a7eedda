"""logrerank_jax.data."""

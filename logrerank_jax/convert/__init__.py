"""logrerank_jax.convert."""

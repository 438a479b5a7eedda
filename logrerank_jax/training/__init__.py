"""logrerank_jax.training."""

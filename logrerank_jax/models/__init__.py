"""logrerank_jax.models."""

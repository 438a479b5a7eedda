"""logrerank_jax: LoG-Reranker (local-to-global sentence graph reranking) in JAX/Flax."""

from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "DataError", "LogRerankError", "__version__"]

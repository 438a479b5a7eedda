"""The limits and names of one server (the `tools/serve.py` flags) and their defaults."""

import dataclasses

from logrerank_jax.engine.defaults import (DEFAULT_MAX_BATCH_TOKENS, DEFAULT_MAX_QUEUE,
                                            DEFAULT_WINDOW_S)

# A 60-document request of long abstracts is ~200 KB of JSON; 16 MiB leaves room for 1,000.
DEFAULT_MAX_BODY_BYTES = 16 << 20
DEFAULT_MAX_DOCUMENTS = 1000
# Seconds from arrival to answer; a CPU under full load scores a 50-passage pool in ~1-2 s.
DEFAULT_TIMEOUT_S = 120.0


@dataclasses.dataclass(frozen=True)
class ServeSettings:
  """Limits and names of one server (the `tools/serve.py` flags)."""
  model_name: str = "logrerank"
  max_batch_tokens: int = DEFAULT_MAX_BATCH_TOKENS
  max_queue: int = DEFAULT_MAX_QUEUE
  max_documents: int = DEFAULT_MAX_DOCUMENTS
  timeout_s: float = DEFAULT_TIMEOUT_S
  window_s: float = DEFAULT_WINDOW_S
  max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
  api_key: str = ""  # `serving.auth`: empty, every route open

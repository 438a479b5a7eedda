"""Serving: one reranking engine behind three doors (Python API, batch CLI, HTTP server).

Modules, one job each (lower ones never import higher ones; `.importlinter` checks it):

  app        the FastAPI app of `tools/serve.py`: Cohere/Jina/vLLM/TEI rerank routes, /log/rerank,
             /health, /info, /metrics (optional `[serve]` extra; nothing below imports it)
  schemas    the Pydantic request/response models of those routes
  batcher    dynamic batching: a bounded queue of requests, gathered into engine chunks by a
             token budget and a short window, scored on one engine thread
  reranker   the public `Reranker` (`from_pretrained`, `rank`, `rerank_records`, `score`, ...)
  scorer     one group of records through the local and global stages (`score_group`)
  pipeline   Grain host threads preparing the next chunks while the devices run
  planner    cutting records into bucketed local calls and whole-graph global calls
  engine     the jitted stages on every local device, compiled executables and their counts

`logrerank_jax.inference` re-exports the public names here for its existing importers.
"""

from logrerank_jax.serving.pipeline import DEFAULT_CHUNK_RECORDS, DEFAULT_HOST_WORKERS
from logrerank_jax.serving.planner import (CALL_FILL, DEFAULT_LOCAL_SLOTS,
                                           DEFAULT_MAX_QUERY_TOKENS, TOKENS_PER_SPAN,
                                           default_packing_config)
from logrerank_jax.serving.reranker import Reranker

__all__ = ["Reranker", "default_packing_config", "DEFAULT_HOST_WORKERS", "DEFAULT_CHUNK_RECORDS",
           "DEFAULT_LOCAL_SLOTS", "DEFAULT_MAX_QUERY_TOKENS", "CALL_FILL", "TOKENS_PER_SPAN"]

"""The reranking engine: one engine behind three doors (Python `Reranker`, `logrerank rerank`, HTTP).

A request goes through these modules in order (lower ones never import higher ones;
`.importlinter` checks it):

  reranker     the Python door: the public `Reranker` (`from_pretrained`, `rank`, `rerank_records`,
               `padding_plan`, `stats`, `precompile`): parses input, scores it on its core,
               builds the results
  batcher      dynamic batching for the HTTP door: a bounded queue gathered into engine chunks
  core         `EngineCore`: one model's planner, devices and prior cache, and the named steps
               (`chunks`, `prepare`, `record_tokens`, `local_nodes`, `score_chunk`, `score`)
               the Python door, the batcher and the training feature pass all use
  pipeline     Grain host threads preparing the next chunks while the devices run
  scorer       one group of records through the local and global stages (`score_group`)
  planner      records -> bucketed local calls and whole-graph global calls (packing)
  device       the jitted stages on every local device, compiled executables and their counts
  prior_cache  the split dense prior's pass once per distinct query and passage window

`from logrerank_jax import Reranker` is the stable import; the names below are the engine's face.
"""

from logrerank_jax.compilation import (DEFAULT_CACHE_ENV, default_compilation_cache_dir,
                                       enable_compilation_cache)
from logrerank_jax.engine.core import EngineCore
from logrerank_jax.engine.pipeline import DEFAULT_CHUNK_RECORDS, DEFAULT_HOST_WORKERS
from logrerank_jax.engine.planner import (CALL_FILL, DEFAULT_LOCAL_SLOTS,
                                          DEFAULT_MAX_QUERY_TOKENS, TOKENS_PER_SPAN,
                                          default_packing_config)
from logrerank_jax.engine.reranker import Reranker
from logrerank_jax.models.model_folder import resolve_model_dir
from logrerank_jax.results import QueryScores, to_openscholar
from logrerank_jax.schema import ROLE_NAMES

__all__ = ["Reranker", "EngineCore", "QueryScores", "default_packing_config",
           "enable_compilation_cache", "default_compilation_cache_dir", "to_openscholar",
           "resolve_model_dir",
           "DEFAULT_CACHE_ENV", "DEFAULT_HOST_WORKERS", "DEFAULT_CHUNK_RECORDS",
           "DEFAULT_LOCAL_SLOTS", "DEFAULT_MAX_QUERY_TOKENS", "CALL_FILL", "TOKENS_PER_SPAN",
           "ROLE_NAMES"]

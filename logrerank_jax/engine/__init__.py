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
  defaults     the tunable defaults (chunk size, host threads, batcher limits); imports nothing

`from logrerank_jax import Reranker` is the stable import; the names below are the engine's face.
"""

from logrerank_jax.lazy_names import lazy_names

# The names resolve on first use (PEP 562), as the package's top level does: the command-line
# parsers read `defaults` through this package, and `logrerank rerank --help` should not pay
# for JAX, Flax and Orbax (about 1 s) to print its flags.
_LAZY = {
    "DEFAULT_CACHE_ENV": "logrerank_jax.compilation",
    "default_compilation_cache_dir": "logrerank_jax.compilation",
    "enable_compilation_cache": "logrerank_jax.compilation",
    "EngineCore": "logrerank_jax.engine.core",
    "DEFAULT_CHUNK_RECORDS": "logrerank_jax.engine.defaults",
    "DEFAULT_HOST_WORKERS": "logrerank_jax.engine.defaults",
    "CALL_FILL": "logrerank_jax.engine.planner",
    "DEFAULT_LOCAL_SLOTS": "logrerank_jax.engine.planner",
    "DEFAULT_MAX_QUERY_TOKENS": "logrerank_jax.engine.planner",
    "TOKENS_PER_SPAN": "logrerank_jax.engine.planner",
    "default_packing_config": "logrerank_jax.engine.planner",
    "Reranker": "logrerank_jax.engine.reranker",
    "resolve_model_dir": "logrerank_jax.models.model_folder",
    "QueryScores": "logrerank_jax.results",
    "to_openscholar": "logrerank_jax.results",
    "ROLE_NAMES": "logrerank_jax.schema",
}
# Submodules reachable as attributes (`engine.planner`) without importing them first.
_SUBMODULES = ("batcher", "core", "defaults", "device", "pipeline", "planner", "prior_cache",
               "reranker", "scorer")

__all__ = ["Reranker", "EngineCore", "QueryScores", "default_packing_config",
           "enable_compilation_cache", "default_compilation_cache_dir", "to_openscholar",
           "resolve_model_dir",
           "DEFAULT_CACHE_ENV", "DEFAULT_HOST_WORKERS", "DEFAULT_CHUNK_RECORDS",
           "DEFAULT_LOCAL_SLOTS", "DEFAULT_MAX_QUERY_TOKENS", "CALL_FILL", "TOKENS_PER_SPAN",
           "ROLE_NAMES"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY, _SUBMODULES)

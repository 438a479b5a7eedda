"""Jit-compiled batch reranking with a trained LoG-Reranker model folder (stable import path).

The engine lives in `logrerank_jax.serving` (planner, engine, host pipeline, the public
`Reranker`; see its package docstring); this module re-exports its public names for the
existing importers (`tools/rerank.py`, `tools/evaluate.py`, the benchmarks, user code):

    import logrerank_jax
    rr = logrerank_jax.Reranker.from_pretrained(path)   # model folder or a workdir with model/
    ranked = rr.rank(query, passages)                   # reranked passages (results.RankedResults)
    out = rr.rerank_records(records)                    # input dicts -> one output dict per record
    rr.compile_stats()                                  # {"xla_compilations", "jit_cache_entries", ...}

The output dicts are the "log" format of `logrerank_jax.results`.
"""

from logrerank_jax.compilation import (DEFAULT_CACHE_ENV, default_compilation_cache_dir,
                                       enable_compilation_cache)
from logrerank_jax.models.model_folder import resolve_model_dir
from logrerank_jax.results import QueryScores, to_openscholar
from logrerank_jax.schema import ROLE_NAMES
from logrerank_jax.serving import (CALL_FILL, DEFAULT_CHUNK_RECORDS, DEFAULT_HOST_WORKERS,
                                   DEFAULT_LOCAL_SLOTS, DEFAULT_MAX_QUERY_TOKENS, TOKENS_PER_SPAN,
                                   Reranker, default_packing_config)

__all__ = ["Reranker", "QueryScores", "default_packing_config", "enable_compilation_cache",
           "default_compilation_cache_dir", "to_openscholar", "resolve_model_dir",
           "DEFAULT_CACHE_ENV", "DEFAULT_HOST_WORKERS", "DEFAULT_CHUNK_RECORDS",
           "DEFAULT_LOCAL_SLOTS", "DEFAULT_MAX_QUERY_TOKENS", "CALL_FILL", "TOKENS_PER_SPAN",
           "ROLE_NAMES"]

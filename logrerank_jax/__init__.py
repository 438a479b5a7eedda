"""logrerank_jax: LoG-Reranker (local-to-global sentence-graph reranking) in JAX/Flax.

What users import:

    import logrerank_jax
    rr = logrerank_jax.Reranker.from_pretrained("runs/demo/global")   # model folder or workdir
    ranked = rr.rank("Does X cause Y?", ["passage one ...", {"title": "t", "text": "..."}])
    ranked[0].index, ranked[0].score, ranked[0].sentences[0].text, ranked.context

  Reranker          jit-compiled batch reranking (`rank`, `rerank_records`)
  RankedResults     `rank`'s answer: RankedPassage entries, best first, plus context units
  LoGConfig         the model configuration (`LoGConfig.paper()`, `.tiny()`, `ablation(...)`)
  LoGReranker       the Flax model (entry points `local_nodes`, `global_logits`, `__call__`)
  ModernBertConfig, ModernBertEncoder, BertConfig, BertEncoder   the encoder families
  save_model / load_model   the model folder (params, config, tokenizer)
  LogRerankError and its kinds DataError, ConfigError, CheckpointError

Training is `logrerank train --config local_stage --workdir DIR` (then `global_stage`);
conversion from PyTorch is `logrerank_jax.convert`; see README.md and docs/ARCHITECTURE.md.
"""

import os as _os

# transformers prints an advisory "PyTorch was not found" line at import on machines without
# torch, where the library needs only its tokenizers; say it once in the docs, not on every run.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

# The public names resolve on first use (PEP 562), so a process that needs one light module (the
# error types a command-line tool reports a bad flag with, the record readers) does not pay for
# JAX, Flax and Orbax at start-up: `tools/train.py` names a bad config in about 0.3 s instead of
# 2.5 s. `from logrerank_jax import Reranker` and `logrerank_jax.Reranker` work as before.
_LAZY = {
    "CheckpointError": "logrerank_jax.errors", "ConfigError": "logrerank_jax.errors",
    "DataError": "logrerank_jax.errors", "LogRerankError": "logrerank_jax.errors",
    "Reranker": "logrerank_jax.engine.reranker",
    "BertConfig": "logrerank_jax.models.encoders.bert",
    "BertEncoder": "logrerank_jax.models.encoders.bert",
    "ModernBertConfig": "logrerank_jax.models.encoders.modernbert",
    "ModernBertEncoder": "logrerank_jax.models.encoders.modernbert",
    "LoGConfig": "logrerank_jax.models.log_reranker",
    "LoGReranker": "logrerank_jax.models.log_reranker",
    "ablation": "logrerank_jax.models.log_reranker",
    "load_model": "logrerank_jax.models.model_folder",
    "save_model": "logrerank_jax.models.model_folder",
    "RankedPassage": "logrerank_jax.results", "RankedResults": "logrerank_jax.results",
    "RankedSentence": "logrerank_jax.results", "RerankResult": "logrerank_jax.results",
}

__version__ = "0.1.0"

__all__ = sorted([*_LAZY, "__version__"])


from logrerank_jax.lazy_names import lazy_names as _lazy_names  # pylint: disable=g-import-not-at-top

__getattr__, __dir__ = _lazy_names(__name__, _LAZY)

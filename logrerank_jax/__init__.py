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
  save_model / load_model   the model folder (params, config, tokenizer)
  LogRerankError and its kinds DataError, ConfigError, CheckpointError

Training is `python tools/train.py --config configs/local_stage.py` (then global_stage.py);
conversion from PyTorch is `logrerank_jax.convert`; see README.md and docs/ARCHITECTURE.md.
"""

import os as _os

# transformers prints an advisory "PyTorch was not found" line at import on machines without
# torch, where the library needs only its tokenizers; say it once in the docs, not on every run.
_os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

from logrerank_jax.errors import CheckpointError, ConfigError, DataError, LogRerankError
from logrerank_jax.inference import Reranker
from logrerank_jax.models.log_reranker import LoGConfig, LoGReranker, ablation
from logrerank_jax.models.model_folder import load_model, save_model
from logrerank_jax.results import RankedPassage, RankedResults, RankedSentence, RerankResult

__version__ = "0.1.0"

__all__ = ["CheckpointError", "ConfigError", "DataError", "LoGConfig", "LoGReranker",
           "LogRerankError", "RankedPassage", "RankedResults", "RankedSentence", "RerankResult",
           "Reranker", "__version__", "ablation", "load_model", "save_model"]

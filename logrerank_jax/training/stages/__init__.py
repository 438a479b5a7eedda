"""The training stages, each one object: its model config, data, init, loss, eval, export.

`make_stage(config, workdir, records)` chooses the stage once; the loop in `trainer.py` then
only calls the stage's methods (`base.Stage`) and never branches on which stage it runs.

  LocalStage   trains encoder + heads on (query, passage) units: L_rank + λ·L_role (eq 19-22).
  GlobalStage  freezes a finished local model, caches its per-sentence outputs once
               (`feature_cache`), and trains the graph encoder and global scorer on query
               graphs with the pairwise loss (eq 23).
  PassageStage the passage cross-encoder *baseline*: a BERT-family `BertSequenceClassifier`
               from `init_checkpoint`, trained on each query's (question, passage) pairs with
               a listwise softmax loss against the gold passage; exports an HF folder.

The LoG stages run the model only through `LoGReranker`'s entry points (`local_nodes`,
`global_logits`).

Modules: `base` (the `Stage` the loop calls), `local`, `global_`, `passage` (one stage each),
`model_config` (model config, packer settings, HF encoders, tokenizer of a training config),
`batching` (streamed, shape-bucketed token micro-batches), `distill` (teacher scores and the
distillation term), `validation` (passage metrics of validation queries). This module is the
package's face: the names below are what the trainer, the tools and the tests use.
"""

from logrerank_jax import losses  # `stages.losses`: the loss module the stages call
from logrerank_jax.training.config_checks import check_stage_settings
from logrerank_jax.training.stages.base import Stage
from logrerank_jax.training.stages.batching import StreamedBatches, pack_token_batches
from logrerank_jax.training.stages.distill import distill_settings, distill_term, with_teacher
from logrerank_jax.training.stages.global_ import GlobalStage
from logrerank_jax.training.stages.local import LocalStage
from logrerank_jax.training.stages.model_config import (build_model_config, check_row_fits,
                                                        encoder_family, forward_packing,
                                                        hf_encoder_params, packing_config,
                                                        training_tokenizer,
                                                        with_attention_dropout, with_hf_encoder)
from logrerank_jax.training.stages.passage import PassageStage, passage_text
from logrerank_jax.training.stages.validation import passage_metrics, unit_qrels

__all__ = [
    "GlobalStage", "LocalStage", "PassageStage", "Stage", "StreamedBatches", "build_model_config",
    "check_row_fits", "distill_settings", "distill_term", "encoder_family", "forward_packing",
    "hf_encoder_params", "losses", "make_stage", "pack_token_batches", "packing_config",
    "passage_metrics", "passage_text", "training_tokenizer", "unit_qrels",
    "with_attention_dropout", "with_hf_encoder", "with_teacher",
]


def make_stage(config, workdir: str, records) -> Stage:
  """Choose the stage once from `config.stage`: `LocalStage`, `GlobalStage` or `PassageStage`."""
  check_stage_settings(config)
  return {"local": LocalStage, "global": GlobalStage,
          "passage": PassageStage}[config.stage](config, workdir, records)

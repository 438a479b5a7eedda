"""Passage cross-encoder baseline: `BertSequenceClassifier` fine-tuned on (question, passage) pairs.

Derived from `local_stage.py` (same keys, same trainer, optimizer and schedule code): stage
"passage" (`training/stages.PassageStage`) scores every passage of a training query as the pair
`[CLS] question [SEP] title text [SEP]` and minimises the listwise softmax cross-entropy of the
query's passages against its rank-1 (gold) passage. The export (`WORKDIR/model`) is an HF
BertForSequenceClassification folder that `baselines.CrossEncoder.from_pretrained` reads
(`tools/evaluate.py --cross-encoder WORKDIR/model`). `micro_batch_size` counts queries here.
"""

from logrerank_jax.training.config_files import sibling_config


def _local_stage():
  return sibling_config(__file__, "local_stage.py")


def get_config(variant: str = ""):
  """Return the passage-stage config; "minilm" is the demo's (same data, lr, frozen layers as
  `local_stage.py:minilm`), "tiny" a test size that still needs `init_checkpoint`."""
  config = _local_stage().get_config(variant)
  config.stage = "passage"
  if variant == "minilm":
    config.micro_batch_size = 1          # queries per update (all of one query's passages)
  return config

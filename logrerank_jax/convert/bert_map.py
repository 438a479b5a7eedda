"""One declarative name map between PyTorch BERT-family state dicts and Flax param trees, both ways.

Uses the `ParamRule` machinery of `modernbert_map` (templates over layers, symbolic shapes,
strict missing / unexpected / mis-shaped checking in both directions).

Key layouts read:
  - `BertModel` / `RobertaModel` / `XLMRobertaModel` (no prefix), with or without the pooler:
    `embeddings.word_embeddings.weight`, `encoder.layer.0.attention.self.query.weight`,
    `pooler.dense.weight`, ... — sentence-transformers folders (e.g. all-MiniLM-L6-v2's
    `model.safetensors`) store exactly these names, plus the `embeddings.position_ids` buffer.
  - `BertForSequenceClassification` (and other task models): the same names under `bert.`
    (`roberta.` for the RoBERTa family), plus top-level task heads (`classifier.*`, `cls.*`,
    `qa_outputs.*`, `lm_head.*`).
Buffers that older transformers saved (`embeddings.position_ids`, `embeddings.token_type_ids`)
are tolerated by name only, and only when they hold the values transformers would rebuild
(arange / zeros); any other unknown key is an error.
"""

import logging
from typing import Any, Dict, List, Mapping, Sequence, Tuple

import numpy as np

from logrerank_jax.convert.modernbert_map import (
    ParamRule,
    Params,
    Rule,
    StateDict,
    expand_rules,
    params_from_torch,
    params_to_torch,
)
from logrerank_jax.errors import CheckpointError

# BertModel (HF naming, no prefix) <-> BertEncoder params. torch LayerNorm weight/bias <-> flax
# LayerNorm scale/bias; torch Linear weight [out, in] <-> flax kernel [in, out] ("linear").
BERT_ENCODER_RULES: Tuple[ParamRule, ...] = (
    ParamRule("embeddings.word_embeddings.weight", "embeddings/word_embeddings/embedding",
              "identity", ("V", "d")),
    ParamRule("embeddings.position_embeddings.weight", "embeddings/position_embeddings/embedding",
              "identity", ("P", "d")),
    ParamRule("embeddings.token_type_embeddings.weight",
              "embeddings/token_type_embeddings/embedding", "identity", ("T", "d")),
    ParamRule("embeddings.LayerNorm.weight", "embeddings/norm/scale", "identity", ("d",)),
    ParamRule("embeddings.LayerNorm.bias", "embeddings/norm/bias", "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.self.query.weight", "layers_{i}/attn/query/kernel",
              "linear", ("d", "d")),
    ParamRule("encoder.layer.{i}.attention.self.query.bias", "layers_{i}/attn/query/bias",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.self.key.weight", "layers_{i}/attn/key/kernel",
              "linear", ("d", "d")),
    ParamRule("encoder.layer.{i}.attention.self.key.bias", "layers_{i}/attn/key/bias",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.self.value.weight", "layers_{i}/attn/value/kernel",
              "linear", ("d", "d")),
    ParamRule("encoder.layer.{i}.attention.self.value.bias", "layers_{i}/attn/value/bias",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.output.dense.weight", "layers_{i}/attn/out/kernel",
              "linear", ("d", "d")),
    ParamRule("encoder.layer.{i}.attention.output.dense.bias", "layers_{i}/attn/out/bias",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.output.LayerNorm.weight", "layers_{i}/attn_norm/scale",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.attention.output.LayerNorm.bias", "layers_{i}/attn_norm/bias",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.intermediate.dense.weight", "layers_{i}/mlp/Wi/kernel",
              "linear", ("I", "d")),
    ParamRule("encoder.layer.{i}.intermediate.dense.bias", "layers_{i}/mlp/Wi/bias",
              "identity", ("I",)),
    ParamRule("encoder.layer.{i}.output.dense.weight", "layers_{i}/mlp/Wo/kernel", "linear",
              ("d", "I")),
    ParamRule("encoder.layer.{i}.output.dense.bias", "layers_{i}/mlp/Wo/bias", "identity",
              ("d",)),
    ParamRule("encoder.layer.{i}.output.LayerNorm.weight", "layers_{i}/mlp_norm/scale",
              "identity", ("d",)),
    ParamRule("encoder.layer.{i}.output.LayerNorm.bias", "layers_{i}/mlp_norm/bias", "identity",
              ("d",)),
)

# BertPooler (part of BertModel when add_pooling_layer=True) <-> BertSequenceClassifier "pooler".
BERT_POOLER_RULES: Tuple[ParamRule, ...] = (
    ParamRule("pooler.dense.weight", "pooler/dense/kernel", "linear", ("d", "d")),
    ParamRule("pooler.dense.bias", "pooler/dense/bias", "identity", ("d",)),
)

# BertForSequenceClassification's own head (top level, HF naming).
BERT_CLASSIFIER_HEAD_RULES: Tuple[ParamRule, ...] = (
    ParamRule("classifier.weight", "classifier/kernel", "linear", ("C", "d")),
    ParamRule("classifier.bias", "classifier/bias", "identity", ("C",)),
)

# Top-level task heads of HF BERT-family task models; converting only the encoder skips them.
BERT_HEAD_MODULES = ("classifier", "cls", "qa_outputs", "lm_head")
# Encoder prefixes of HF task models (BertFor* / RobertaFor* / XLMRobertaFor*).
BERT_TORCH_PREFIXES = ("bert.", "roberta.")
# Non-persistent buffers that older transformers versions saved into checkpoints, with the
# values transformers rebuilds them with; tolerated by exact name only.
BERT_BUFFER_KEYS = ("embeddings.position_ids", "embeddings.token_type_ids")


def bert_dims(cfg) -> Dict[str, int]:
  """Return the symbolic dimension table the BERT rules use."""
  return {"V": int(cfg.vocab_size), "d": int(cfg.hidden_size),
          "I": int(cfg.intermediate_size), "P": int(cfg.max_position_embeddings),
          "T": int(cfg.type_vocab_size), "C": int(getattr(cfg, "num_labels", 1))}


def bert_torch_prefix(cfg) -> str:
  """Return the encoder prefix HF task models of this family use ("bert." or "roberta.")."""
  return "bert." if getattr(cfg, "model_type", "bert") == "bert" else "roberta."


def bert_encoder_rules(cfg, torch_prefix: str = "", flax_prefix: Sequence[str] = ()) -> List[Rule]:
  """Return the concrete encoder rules for `cfg` (BertModel naming, no pooler)."""
  return expand_rules(BERT_ENCODER_RULES, cfg, bert_dims(cfg), torch_prefix=torch_prefix,
                      flax_prefix=flax_prefix)


def bert_pooler_rules(cfg, torch_prefix: str = "") -> List[Rule]:
  """Return the concrete pooler rules (`{torch_prefix}pooler.dense.*` <-> `pooler/dense/*`)."""
  return expand_rules(BERT_POOLER_RULES, cfg, bert_dims(cfg), torch_prefix=torch_prefix)


def bert_sequence_classifier_rules(cfg) -> List[Rule]:
  """Return the concrete BertForSequenceClassification rules for `cfg` (HF naming)."""
  prefix = bert_torch_prefix(cfg)
  return (bert_encoder_rules(cfg, prefix, ("bert",)) + bert_pooler_rules(cfg, prefix)
          + expand_rules(BERT_CLASSIFIER_HEAD_RULES, cfg, bert_dims(cfg)))


def check_bert_buffer(name: str, value: Any, cfg) -> str:
  """Return a problem description if a tolerated buffer does not hold transformers' values."""
  arr = np.asarray(value)
  n = int(cfg.max_position_embeddings)
  want = (np.arange(n)[None] if name == "embeddings.position_ids" else np.zeros((1, n)))
  if arr.shape != want.shape or not np.issubdtype(arr.dtype, np.integer) or not np.array_equal(
      arr, want):
    return (f"{name}: a buffer that must be {'arange' if 'position' in name else 'zeros'} of "
            f"shape {want.shape}, got shape {arr.shape} dtype {arr.dtype}")
  return ""


def pop_bert_buffers(sd: Mapping[str, Any], cfg, prefixes: Sequence[str] = ("",) + BERT_TORCH_PREFIXES,
                     what: str = "state dict") -> Tuple[Dict[str, Any], List[str]]:
  """Split transformers' id buffers (`BERT_BUFFER_KEYS`, under any of `prefixes`) off a state dict.

  The one place both BERT-family readers (`bert_params_from_torch`, and the LoG reader in
  `log_map` with its `local.encoder.` prefix) tolerate the buffers: by exact name, and only
  when they hold the values transformers rebuilds them with.

  Returns:
    (the state dict without the buffers, the buffer keys found).

  Raises:
    CheckpointError: naming every buffer that holds other values.
  """
  rest: Dict[str, Any] = {}
  found, bad = [], []
  for key, value in sd.items():
    prefix = next((p for p in prefixes if key.startswith(p) and key[len(p):] in BERT_BUFFER_KEYS),
                  None)
    if prefix is None:
      rest[key] = value
      continue
    found.append(key)
    problem = check_bert_buffer(key[len(prefix):], value, cfg)
    if problem:
      bad.append(prefix + problem)
  if bad:
    raise CheckpointError(f"{what} buffers hold unexpected values: {bad}")
  return rest, found


def _canonical_keys(sd: Mapping[str, Any], cfg) -> Tuple[Dict[str, Any], List[str], List[str]]:
  """Strip the task-model encoder prefix; split off task heads and tolerated buffers.

  Returns:
    (encoder-named state dict without buffers, head key names, buffer key names found).

  Raises:
    CheckpointError: the same tensor appears with and without a prefix, or a buffer holds
      values transformers would not rebuild.
  """
  sd, buffers = pop_bert_buffers(sd, cfg)
  out: Dict[str, Any] = {}
  source: Dict[str, str] = {}
  heads, clashes = [], []
  for key, value in sd.items():
    bare = key
    for prefix in BERT_TORCH_PREFIXES:
      if key.startswith(prefix):
        bare = key[len(prefix):]
        break
    if bare in out:
      clashes.append(f"{source[bare]} / {key}")
      continue
    out[bare] = value
    source[bare] = key
    if bare.split(".", 1)[0] in BERT_HEAD_MODULES:
      heads.append(bare)
  if clashes:
    raise CheckpointError("state dict holds the same tensor with and without the "
                          f"{'/'.join(BERT_TORCH_PREFIXES)} prefix: {clashes}")
  return out, heads, buffers


def bert_params_from_torch(sd: Mapping[str, Any], cfg) -> Params:
  """Convert a BERT-family torch state dict into `BertEncoder` params.

  Accepts `BertModel` keys (`encoder.layer.0.attention.self.query.weight`, as sentence-
  transformers folders store them) and task-model keys (`bert.encoder...` from
  BertForSequenceClassification etc.; `roberta.` for the RoBERTa family). The pooler
  (`pooler.dense.*`, optional) and task heads (`classifier.*`, `cls.*`, `qa_outputs.*`,
  `lm_head.*`) are recognised and skipped, logged at INFO; the buffers
  `embeddings.position_ids` / `embeddings.token_type_ids` are tolerated by name; any other key
  the encoder does not use is reported as unexpected.

  Args:
    sd: `{torch name: array}`, e.g. from `load_torch_state_dict`.
    cfg: a `BertConfig`.

  Returns:
    The inner param tree (use as `{"params": params}`), float32 NumPy leaves.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped key at once.
  """
  canon, heads, _ = _canonical_keys(sd, cfg)
  pooler = [r.torch_name for r in bert_pooler_rules(cfg) if r.torch_name in canon]
  if heads or pooler:
    logging.info("bert_params_from_torch: skipping %d pooler / task-head tensors: %s",
                 len(heads) + len(pooler), pooler + heads)
  return params_from_torch(canon, bert_encoder_rules(cfg), skipped=heads + pooler,
                           what="BERT encoder state dict")


def bert_params_to_torch(params: Mapping[str, Any], cfg) -> StateDict:
  """Convert `BertEncoder` params into a `BertModel` state dict (HF naming, no prefix, no pooler).

  Args:
    params: the encoder's inner param tree.
    cfg: a `BertConfig`.

  Returns:
    `{torch name: float32 np.ndarray}` that
    `BertModel(config, add_pooling_layer=False).load_state_dict(strict=True)` accepts.
  """
  return params_to_torch(params, bert_encoder_rules(cfg), what="BERT encoder params")


def bert_sequence_classifier_params_from_torch(sd: Mapping[str, Any], cfg) -> Params:
  """Convert a BertForSequenceClassification state dict into `BertSequenceClassifier` params.

  Encoder and pooler keys may carry the `bert.` prefix (HF) or not; `classifier.*` is top-level.

  Args:
    sd: `{torch name: array}`.
    cfg: a `BertConfig` (uses `num_labels`).

  Returns:
    `{"bert": encoder tree, "pooler": {"dense"}, "classifier": {...}}`, float32 leaves.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped key at once.
  """
  canon, heads, _ = _canonical_keys(sd, cfg)
  prefix = bert_torch_prefix(cfg)
  renamed = {(k if k in heads else prefix + k): v for k, v in canon.items()}
  return params_from_torch(renamed, bert_sequence_classifier_rules(cfg),
                           what="BERT sequence-classifier state dict")


def bert_sequence_classifier_params_to_torch(params: Mapping[str, Any], cfg) -> StateDict:
  """Convert `BertSequenceClassifier` params into a BertForSequenceClassification state dict.

  Args:
    params: the classifier's inner param tree.
    cfg: a `BertConfig`.

  Returns:
    `{torch name: float32 np.ndarray}` in HF naming (`bert.` prefix, `classifier.*`).
  """
  return params_to_torch(params, bert_sequence_classifier_rules(cfg),
                         what="BERT sequence-classifier params")

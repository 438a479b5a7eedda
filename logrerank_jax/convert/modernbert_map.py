"""One declarative name map between PyTorch ModernBERT state dicts and Flax param trees, both ways.

A checkpoint is described by a list of `ParamRule` templates: a torch name and a Flax path (both
may hold a `{i}` layer placeholder), a per-tensor transform name, the torch shape in symbolic
dimensions, and optional conditions (a boolean config field; a first layer). `expand_rules` turns
templates into concrete `Rule`s for one config, and `params_from_torch` / `params_to_torch` apply
them in either direction with full missing / unexpected / mis-shaped checking. The later full
LoG-Reranker converter extends the map by concatenating its own templates (with its own `dims`)
to `MODERNBERT_ENCODER_RULES`.
"""

import logging
from typing import (Any, Callable, Dict, Iterable, List, Mapping, NamedTuple, Optional, Sequence,
                    Tuple)

import numpy as np

from logrerank_jax.errors import CheckpointError

StateDict = Dict[str, np.ndarray]
Params = Dict[str, Any]


class ParamRule(NamedTuple):
  """One torch tensor <-> one Flax leaf, as a template over layers and config switches."""
  torch_name: str            # e.g. "layers.{i}.attn.Wqkv.weight"
  flax_path: str             # "/"-joined, e.g. "layers_{i}/attn/Wqkv/kernel"
  transform: str             # key of TRANSFORMS
  torch_shape: Tuple[str, ...]  # symbolic dims, resolved through a `dims` mapping
  when: Optional[str] = None    # name of a boolean config field that must be true
  first_layer: int = 0          # a `{i}` rule applies to layers first_layer .. num_hidden_layers-1


class Rule(NamedTuple):
  """A `ParamRule` made concrete for one config."""
  torch_name: str
  flax_path: Tuple[str, ...]
  transform: str
  torch_shape: Tuple[int, ...]


class Transform(NamedTuple):
  """A per-tensor transform: torch -> Flax, Flax -> torch, and the Flax shape of a torch shape."""
  to_flax: Callable[[np.ndarray], np.ndarray]
  to_torch: Callable[[np.ndarray], np.ndarray]
  flax_shape: Callable[[Tuple[int, ...]], Tuple[int, ...]]


def _transpose(x: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(x.T)


def _identity(x: np.ndarray) -> np.ndarray:
  return x


# torch nn.Linear stores weight [out, in] and computes x @ W.T; flax Dense stores kernel [in, out].
TRANSFORMS: Dict[str, Transform] = {
    "linear": Transform(_transpose, _transpose, lambda s: tuple(reversed(s))),
    "identity": Transform(_identity, _identity, lambda s: tuple(s)),
}

# ModernBertModel (HF naming, no prefix) <-> ModernBertEncoder params (contract C1).
# torch LayerNorm weight/bias <-> flax LayerNorm scale/bias; layer 0 has no attn_norm
# (nn.Identity in torch), hence first_layer=1.
MODERNBERT_ENCODER_RULES: Tuple[ParamRule, ...] = (
    ParamRule("embeddings.tok_embeddings.weight", "embeddings/tok_embeddings/embedding",
              "identity", ("V", "d")),
    ParamRule("embeddings.norm.weight", "embeddings/norm/scale", "identity", ("d",)),
    ParamRule("embeddings.norm.bias", "embeddings/norm/bias", "identity", ("d",),
              when="norm_bias"),
    ParamRule("layers.{i}.attn_norm.weight", "layers_{i}/attn_norm/scale", "identity", ("d",),
              first_layer=1),
    ParamRule("layers.{i}.attn_norm.bias", "layers_{i}/attn_norm/bias", "identity", ("d",),
              when="norm_bias", first_layer=1),
    ParamRule("layers.{i}.attn.Wqkv.weight", "layers_{i}/attn/Wqkv/kernel", "linear",
              ("3d", "d")),
    ParamRule("layers.{i}.attn.Wqkv.bias", "layers_{i}/attn/Wqkv/bias", "identity", ("3d",),
              when="attention_bias"),
    ParamRule("layers.{i}.attn.Wo.weight", "layers_{i}/attn/Wo/kernel", "linear", ("d", "d")),
    ParamRule("layers.{i}.attn.Wo.bias", "layers_{i}/attn/Wo/bias", "identity", ("d",),
              when="attention_bias"),
    ParamRule("layers.{i}.mlp_norm.weight", "layers_{i}/mlp_norm/scale", "identity", ("d",)),
    ParamRule("layers.{i}.mlp_norm.bias", "layers_{i}/mlp_norm/bias", "identity", ("d",),
              when="norm_bias"),
    ParamRule("layers.{i}.mlp.Wi.weight", "layers_{i}/mlp/Wi/kernel", "linear", ("2I", "d")),
    ParamRule("layers.{i}.mlp.Wi.bias", "layers_{i}/mlp/Wi/bias", "identity", ("2I",),
              when="mlp_bias"),
    ParamRule("layers.{i}.mlp.Wo.weight", "layers_{i}/mlp/Wo/kernel", "linear", ("d", "I")),
    ParamRule("layers.{i}.mlp.Wo.bias", "layers_{i}/mlp/Wo/bias", "identity", ("d",),
              when="mlp_bias"),
    ParamRule("final_norm.weight", "final_norm/scale", "identity", ("d",)),
    ParamRule("final_norm.bias", "final_norm/bias", "identity", ("d",), when="norm_bias"),
)

# ModernBertForSequenceClassification head (HF naming) <-> ModernBertSequenceClassifier params.
# The HF classifier Linear always has a bias; classifier_bias governs head.dense only.
SEQUENCE_CLASSIFIER_HEAD_RULES: Tuple[ParamRule, ...] = (
    ParamRule("head.dense.weight", "head/dense/kernel", "linear", ("d", "d")),
    ParamRule("head.dense.bias", "head/dense/bias", "identity", ("d",), when="classifier_bias"),
    ParamRule("head.norm.weight", "head/norm/scale", "identity", ("d",)),
    ParamRule("head.norm.bias", "head/norm/bias", "identity", ("d",), when="norm_bias"),
    ParamRule("classifier.weight", "classifier/kernel", "linear", ("C", "d")),
    ParamRule("classifier.bias", "classifier/bias", "identity", ("C",)),
)

# Top-level module names of HF ModernBERT task heads (ForSequenceClassification / ForMaskedLM /
# ForTokenClassification ...). Converting only the encoder from such a checkpoint skips them.
HEAD_MODULES = ("head", "classifier", "decoder")
ENCODER_TORCH_PREFIX = "model."


def modernbert_dims(cfg) -> Dict[str, int]:
  """Return the symbolic dimension table the ModernBERT rules use."""
  d, inter = int(cfg.hidden_size), int(cfg.intermediate_size)
  return {"V": int(cfg.vocab_size), "d": d, "3d": 3 * d, "I": inter, "2I": 2 * inter,
          "C": int(getattr(cfg, "num_labels", 1))}


def expand_rules(templates: Iterable[ParamRule], cfg, dims: Mapping[str, int], *,
                 num_layers: Optional[int] = None, torch_prefix: str = "",
                 flax_prefix: Sequence[str] = ()) -> List[Rule]:
  """Make rule templates concrete for one config.

  Args:
    templates: `ParamRule`s; `{i}` rules are repeated for each layer from `first_layer`.
    cfg: config object; `when` names one of its boolean fields.
    dims: symbolic dimension name -> size.
    num_layers: layer count for `{i}`; defaults to `cfg.num_hidden_layers`.
    torch_prefix: prepended to every torch name (e.g. "model.").
    flax_prefix: prepended to every Flax path (e.g. ("model",)).

  Returns:
    The concrete rules, in template order, layers ascending.
  """
  if num_layers is None:
    num_layers = int(cfg.num_hidden_layers)
  rules = []
  for t in templates:
    if t.transform not in TRANSFORMS:
      raise CheckpointError(f"rule {t.torch_name!r} names unknown transform {t.transform!r}")
    if t.when is not None and not bool(getattr(cfg, t.when)):
      continue
    try:
      shape = tuple(int(dims[s]) for s in t.torch_shape)
    except KeyError as e:
      raise CheckpointError(f"rule {t.torch_name!r} uses unknown dimension {e.args[0]!r}") from None
    layers = range(t.first_layer, num_layers) if "{i}" in t.torch_name else [None]
    for i in layers:
      torch_name = t.torch_name if i is None else t.torch_name.replace("{i}", str(i))
      flax_path = t.flax_path if i is None else t.flax_path.replace("{i}", str(i))
      rules.append(Rule(torch_prefix + torch_name, tuple(flax_prefix) + tuple(flax_path.split("/")),
                        t.transform, shape))
  return rules


def modernbert_encoder_rules(cfg, torch_prefix: str = "",
                             flax_prefix: Sequence[str] = ()) -> List[Rule]:
  """Return the concrete encoder rules for `cfg`."""
  return expand_rules(MODERNBERT_ENCODER_RULES, cfg, modernbert_dims(cfg),
                      torch_prefix=torch_prefix, flax_prefix=flax_prefix)


def sequence_classifier_rules(cfg) -> List[Rule]:
  """Return the concrete ModernBertForSequenceClassification rules for `cfg` (HF naming)."""
  return (modernbert_encoder_rules(cfg, ENCODER_TORCH_PREFIX, ("model",))
          + expand_rules(SEQUENCE_CLASSIFIER_HEAD_RULES, cfg, modernbert_dims(cfg)))


def params_from_torch(sd: Mapping[str, Any], rules: Sequence[Rule], *, skipped: Iterable[str] = (),
                      what: str = "checkpoint") -> Params:
  """Convert a torch state dict into a nested float32 Flax param tree by `rules`.

  Args:
    sd: `{torch name: array}`, already in the rules' naming.
    rules: concrete rules; every one must be matched exactly once.
    skipped: names in `sd` known to be irrelevant (not reported as unexpected).
    what: what is being converted, for the error message.

  Returns:
    Nested dict of float32 NumPy arrays.

  Raises:
    CheckpointError: one error naming every missing, unexpected and mis-shaped key.
  """
  skipped = set(skipped)
  expected = {r.torch_name for r in rules}
  missing = [r.torch_name for r in rules if r.torch_name not in sd]
  unexpected = sorted(k for k in sd if k not in expected and k not in skipped)
  misshaped = []
  for r in rules:
    got = tuple(np.shape(sd[r.torch_name])) if r.torch_name in sd else r.torch_shape
    if got != r.torch_shape:
      misshaped.append(f"{r.torch_name}: expected {r.torch_shape}, got {got}")
  _raise_mismatch(what, missing, unexpected, misshaped)
  params: Params = {}
  for r in rules:
    # A copy, so the params never alias (possibly read-only or memory-mapped) checkpoint buffers.
    value = TRANSFORMS[r.transform].to_flax(np.asarray(sd[r.torch_name], dtype=np.float32))
    value = np.array(value, order="C")
    _set_path(params, r.flax_path, value)
  return params


def params_to_torch(params: Mapping[str, Any], rules: Sequence[Rule], *,
                    what: str = "params") -> StateDict:
  """Convert a Flax param tree into a `{torch name: float32 np.ndarray}` state dict by `rules`.

  Args:
    params: nested mapping (dict or FrozenDict) of arrays; a lone top-level "params" is unwrapped.
    rules: concrete rules; every Flax leaf must be matched exactly once.
    what: what is being converted, for the error message.

  Returns:
    The state dict, in rule order, contiguous float32 arrays that `torch.from_numpy` accepts.

  Raises:
    CheckpointError: one error naming every missing, unexpected and mis-shaped Flax path.
  """
  if isinstance(params, Mapping) and set(params.keys()) == {"params"}:
    params = params["params"]
  leaves = dict(_flatten(params))
  expected = {r.flax_path for r in rules}
  missing = ["/".join(r.flax_path) for r in rules if r.flax_path not in leaves]
  unexpected = sorted("/".join(p) for p in leaves if p not in expected)
  misshaped = []
  for r in rules:
    if r.flax_path in leaves:
      want = TRANSFORMS[r.transform].flax_shape(r.torch_shape)
      got = tuple(np.shape(leaves[r.flax_path]))
      if got != want:
        misshaped.append(f"{'/'.join(r.flax_path)}: expected {want}, got {got}")
  _raise_mismatch(what, missing, unexpected, misshaped)
  # Fresh, writable, C-ordered copies: torch.from_numpy warns on read-only (e.g. jax-backed) arrays.
  out: StateDict = {}
  for r in rules:
    value = TRANSFORMS[r.transform].to_torch(np.asarray(leaves[r.flax_path], dtype=np.float32))
    out[r.torch_name] = np.array(value, order="C")
  return out


def _raise_mismatch(what: str, missing: List[str], unexpected: List[str],
                    misshaped: List[str]) -> None:
  """Raise one CheckpointError naming every problem, or nothing when there is none."""
  parts = []
  if missing:
    parts.append(f"missing keys {missing}")
  if unexpected:
    parts.append(f"unexpected keys {unexpected}")
  if misshaped:
    parts.append(f"mis-shaped keys [{'; '.join(misshaped)}]")
  if parts:
    raise CheckpointError(f"{what} does not match the config: " + "; ".join(parts))


def _set_path(tree: Params, path: Tuple[str, ...], value: np.ndarray) -> None:
  node = tree
  for part in path[:-1]:
    node = node.setdefault(part, {})
  node[path[-1]] = value


def _flatten(tree: Mapping[str, Any], prefix: Tuple[str, ...] = ()):
  """Yield (path tuple, leaf) for every leaf of a nested mapping."""
  for key, value in tree.items():
    path = prefix + (str(key),)
    if isinstance(value, Mapping):
      yield from _flatten(value, path)
    else:
      yield path, value


def _canonical_keys(sd: Mapping[str, Any], encoder_prefix: str) -> Tuple[Dict[str, Any], List[str]]:
  """Rename keys so encoder tensors carry exactly `encoder_prefix`; split off task-head keys.

  Returns:
    (renamed state dict, names of head keys: top-level `head.*`, `classifier.*`, `decoder.*`).
  """
  out: Dict[str, Any] = {}
  source: Dict[str, str] = {}
  heads = []
  clashes = []
  for key, value in sd.items():
    bare = key[len(ENCODER_TORCH_PREFIX):] if key.startswith(ENCODER_TORCH_PREFIX) else key
    is_head = bare.split(".", 1)[0] in HEAD_MODULES
    name = bare if is_head else encoder_prefix + bare
    if name in out:
      clashes.append(f"{source[name]} / {key}")
      continue
    out[name] = value
    source[name] = key
    if is_head:
      heads.append(name)
  if clashes:
    raise CheckpointError("state dict holds the same tensor with and without the 'model.' "
                          f"prefix: {clashes}")
  return out, heads


def modernbert_params_from_torch(sd: Mapping[str, Any], cfg) -> Params:
  """Convert a ModernBERT torch state dict into `ModernBertEncoder` params.

  Accepts `ModernBertModel` keys (`layers.0.attn.Wqkv.weight`) and task-model keys
  (`model.layers.0...` from ModernBertForSequenceClassification / ForMaskedLM ...). The task
  heads' own tensors (`head.*`, `classifier.*`, `decoder.*`) are recognised and skipped, logged
  at INFO; any other key the encoder does not use is reported as unexpected.

  Args:
    sd: `{torch name: array}`, e.g. from `load_torch_state_dict`.
    cfg: a `ModernBertConfig` (or any object with its fields).

  Returns:
    The inner param tree (use as `{"params": params}`), float32 NumPy leaves.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped key at once.
  """
  canon, heads = _canonical_keys(sd, "")
  if heads:
    logging.info("modernbert_params_from_torch: skipping %d task-head tensors: %s", len(heads),
                 heads)
  return params_from_torch(canon, modernbert_encoder_rules(cfg), skipped=heads,
                           what="ModernBERT encoder state dict")


def modernbert_params_to_torch(params: Mapping[str, Any], cfg) -> StateDict:
  """Convert `ModernBertEncoder` params into a `ModernBertModel` state dict (HF naming, no prefix).

  Args:
    params: the encoder's inner param tree.
    cfg: a `ModernBertConfig`.

  Returns:
    `{torch name: float32 np.ndarray}` that `ModernBertModel.load_state_dict(strict=True)` accepts.
  """
  return params_to_torch(params, modernbert_encoder_rules(cfg), what="ModernBERT encoder params")


def sequence_classifier_params_from_torch(sd: Mapping[str, Any], cfg) -> Params:
  """Convert a ModernBertForSequenceClassification state dict into classifier params.

  Encoder keys may carry the `model.` prefix (HF) or not; `head.*` and `classifier.*` are top-level.

  Args:
    sd: `{torch name: array}`.
    cfg: a `ModernBertConfig` (uses `num_labels`, `classifier_bias`, `norm_bias`).

  Returns:
    `{"model": encoder tree, "head": {"dense", "norm"}, "classifier": {...}}`, float32 leaves.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped key at once.
  """
  canon, _ = _canonical_keys(sd, ENCODER_TORCH_PREFIX)
  return params_from_torch(canon, sequence_classifier_rules(cfg),
                           what="ModernBERT sequence-classifier state dict")


def sequence_classifier_params_to_torch(params: Mapping[str, Any], cfg) -> StateDict:
  """Convert `ModernBertSequenceClassifier` params into a HF classifier state dict.

  Args:
    params: the classifier's inner param tree.
    cfg: a `ModernBertConfig`.

  Returns:
    `{torch name: float32 np.ndarray}` in HF naming (`model.` prefix, `head.*`, `classifier.*`).
  """
  return params_to_torch(params, sequence_classifier_rules(cfg),
                         what="ModernBERT sequence-classifier params")

"""The full LoG-Reranker name map (local + global) between PyTorch state dicts and Flax params.

The torch key layout (documented with paper-size shapes in docs/CHECKPOINTS.md) is

  local.encoder.<HF ModernBertModel key>        e.g. local.encoder.layers.0.attn.Wqkv.weight
                (or <HF BertModel key, no pooler> for a BERT-family encoder, e.g.
                local.encoder.encoder.layer.0.attention.self.query.weight)
  local.{intent_mlp,role_mlp,local_mlp}.{hidden,out}.{weight,bias}
  local.proj_g.weight                           (W_p, no bias)
  global.node_init.{phi_h,phi_r,phi_z}.{weight,bias}, global.node_init.norm.{weight,bias}
  global.layers.{i}.attn.W_v.weight             (no bias)
  global.layers.{i}.attn.W_rel                  [T, d_g, d_g], applied as x @ W_rel[t]
  global.layers.{i}.attn.rel_emb.weight         [T, relation_dim] (an nn.Embedding)
  global.layers.{i}.attn.att                    [H, 2 d_g/H + relation_dim]
  global.layers.{i}.attn.W_o.{weight,bias}, global.layers.{i}.{attn_norm,ffn_norm}.{weight,bias}
  global.layers.{i}.ffn.{Wi,Wo}.{weight,bias}, global.scorer.{hidden,out}.{weight,bias}

and maps one-to-one onto the tree `logrerank_jax.models.log_reranker.init_params` returns. It is
built from the same `ParamRule` templates and `params_from_torch` / `params_to_torch` as the
encoder map, so key coverage is strict in both directions. A user rename table (exact names
and/or regexes) adapts a differently-named checkpoint before the strict check.
"""

import json
import os
import re
from typing import Any, Dict, List, Mapping, Tuple, Union

from logrerank_jax.convert.bert_map import bert_encoder_rules, pop_bert_buffers
from logrerank_jax.convert.modernbert_map import (MODERNBERT_ENCODER_RULES, ParamRule, Params,
                                                  Rule, StateDict, expand_rules, modernbert_dims,
                                                  params_from_torch, params_to_torch)
from logrerank_jax.errors import CheckpointError, ConfigError
from logrerank_jax.models.encoders.bert import BertConfig

LOCAL_PREFIX = "local."
ENCODER_PREFIX = "local.encoder."
GLOBAL_PREFIX = "global."

# Local heads (LocalScorer minus its encoder); `when` names LocalScorerConfig head switches.
LOCAL_HEAD_RULES: Tuple[ParamRule, ...] = (
    ParamRule("intent_mlp.hidden.weight", "intent_mlp/hidden/kernel", "linear", ("Hi", "d"),
              when="use_intent_head"),
    ParamRule("intent_mlp.hidden.bias", "intent_mlp/hidden/bias", "identity", ("Hi",),
              when="use_intent_head"),
    ParamRule("intent_mlp.out.weight", "intent_mlp/out/kernel", "linear", ("3", "Hi"),
              when="use_intent_head"),
    ParamRule("intent_mlp.out.bias", "intent_mlp/out/bias", "identity", ("3",),
              when="use_intent_head"),
    ParamRule("role_mlp.hidden.weight", "role_mlp/hidden/kernel", "linear", ("Hr", "d"),
              when="use_role_head"),
    ParamRule("role_mlp.hidden.bias", "role_mlp/hidden/bias", "identity", ("Hr",),
              when="use_role_head"),
    ParamRule("role_mlp.out.weight", "role_mlp/out/kernel", "linear", ("3", "Hr"),
              when="use_role_head"),
    ParamRule("role_mlp.out.bias", "role_mlp/out/bias", "identity", ("3",), when="use_role_head"),
    ParamRule("proj_g.weight", "proj_g/kernel", "linear", ("g", "3")),
    ParamRule("local_mlp.hidden.weight", "local_mlp/hidden/kernel", "linear", ("Hl", "2d+g")),
    ParamRule("local_mlp.hidden.bias", "local_mlp/hidden/bias", "identity", ("Hl",)),
    ParamRule("local_mlp.out.weight", "local_mlp/out/kernel", "linear", ("1", "Hl")),
    ParamRule("local_mlp.out.bias", "local_mlp/out/bias", "identity", ("1",)),
    # Not in the paper: the dense prior's scale (LocalScorerConfig.dense_prior > 0 only).
    ParamRule("dense_prior_scale", "dense_prior_scale", "identity", ("1",),
              when="use_dense_prior"),
)

# GraphReranker. W_rel is stored [T, in, out] on both sides (x @ W_rel[t]), so it is not
# transposed; rel_emb and att are plain tensors too.
GRAPH_RERANKER_RULES: Tuple[ParamRule, ...] = (
    ParamRule("node_init.phi_h.weight", "node_init/phi_h/kernel", "linear", ("dg", "de")),
    ParamRule("node_init.phi_h.bias", "node_init/phi_h/bias", "identity", ("dg",)),
    ParamRule("node_init.phi_r.weight", "node_init/phi_r/kernel", "linear", ("dg", "3")),
    ParamRule("node_init.phi_r.bias", "node_init/phi_r/bias", "identity", ("dg",)),
    ParamRule("node_init.phi_z.weight", "node_init/phi_z/kernel", "linear", ("dg", "1")),
    ParamRule("node_init.phi_z.bias", "node_init/phi_z/bias", "identity", ("dg",)),
    ParamRule("node_init.norm.weight", "node_init/norm/scale", "identity", ("dg",)),
    ParamRule("node_init.norm.bias", "node_init/norm/bias", "identity", ("dg",)),
    ParamRule("layers.{i}.attn.W_v.weight", "layers_{i}/attn/W_v/kernel", "linear", ("dg", "dg")),
    ParamRule("layers.{i}.attn.W_rel", "layers_{i}/attn/W_rel", "identity", ("T", "dg", "dg")),
    ParamRule("layers.{i}.attn.rel_emb.weight", "layers_{i}/attn/rel_emb", "identity", ("T", "R")),
    ParamRule("layers.{i}.attn.att", "layers_{i}/attn/att", "identity", ("H", "A")),
    ParamRule("layers.{i}.attn.W_o.weight", "layers_{i}/attn/W_o/kernel", "linear", ("dg", "dg")),
    ParamRule("layers.{i}.attn.W_o.bias", "layers_{i}/attn/W_o/bias", "identity", ("dg",)),
    ParamRule("layers.{i}.attn_norm.weight", "layers_{i}/attn_norm/scale", "identity", ("dg",)),
    ParamRule("layers.{i}.attn_norm.bias", "layers_{i}/attn_norm/bias", "identity", ("dg",)),
    ParamRule("layers.{i}.ffn.Wi.weight", "layers_{i}/ffn/Wi/kernel", "linear", ("F", "dg")),
    ParamRule("layers.{i}.ffn.Wi.bias", "layers_{i}/ffn/Wi/bias", "identity", ("F",)),
    ParamRule("layers.{i}.ffn.Wo.weight", "layers_{i}/ffn/Wo/kernel", "linear", ("dg", "F")),
    ParamRule("layers.{i}.ffn.Wo.bias", "layers_{i}/ffn/Wo/bias", "identity", ("dg",)),
    ParamRule("layers.{i}.ffn_norm.weight", "layers_{i}/ffn_norm/scale", "identity", ("dg",)),
    ParamRule("layers.{i}.ffn_norm.bias", "layers_{i}/ffn_norm/bias", "identity", ("dg",)),
    ParamRule("scorer.hidden.weight", "scorer/hidden/kernel", "linear", ("M", "dg")),
    ParamRule("scorer.hidden.bias", "scorer/hidden/bias", "identity", ("M",)),
    ParamRule("scorer.out.weight", "scorer/out/kernel", "linear", ("1", "M")),
    ParamRule("scorer.out.bias", "scorer/out/bias", "identity", ("1",)),
)


def log_dims(cfg) -> Dict[str, int]:
  """Return the symbolic dimension table of the LoG rules for a `LoGConfig`."""
  local, gat = cfg.local_scorer_config, cfg.graph_reranker_config
  d = int(local.encoder.hidden_size)
  # A BERT encoder's rules expand with their own table (`bert_dims`: its "T" is the token-type
  # vocabulary, here "T" is the GAT's relations).
  dims = ({"d": d} if isinstance(local.encoder, BertConfig)
          else dict(modernbert_dims(local.encoder)))
  dims.update({
      "1": 1, "3": 3, "Hi": int(local.intent_hidden), "Hr": int(local.role_hidden),
      "g": int(local.g_dim), "Hl": int(local.local_hidden), "2d+g": 2 * d + int(local.g_dim),
      "de": int(gat.d_enc), "dg": int(gat.d_model), "T": int(gat.num_relations),
      "R": int(gat.relation_dim), "H": int(gat.num_heads),
      "A": 2 * int(gat.head_dim) + int(gat.relation_dim), "F": int(gat.ffn_dim),
      "M": int(gat.mlp_hidden),
  })
  return dims


def log_rules(cfg) -> List[Rule]:
  """Return the concrete torch <-> Flax rules of the full model for a `LoGConfig`.

  Args:
    cfg: the `LoGConfig`; its ablation switches decide which heads exist (`use_role_head`,
      `use_intent_head`), whether there is a global part (`use_global`) and how many relations
      the GAT has (`use_edge_types`).

  Returns:
    Encoder rules (`local.encoder.*`), local head rules (`local.*`), then global rules
    (`global.*`, only with `use_global`).
  """
  dims = log_dims(cfg)
  local = cfg.local_scorer_config
  if isinstance(local.encoder, BertConfig):
    rules = bert_encoder_rules(local.encoder, torch_prefix=ENCODER_PREFIX,
                               flax_prefix=("local", "encoder"))
  else:
    rules = expand_rules(MODERNBERT_ENCODER_RULES, local.encoder, dims,
                         torch_prefix=ENCODER_PREFIX, flax_prefix=("local", "encoder"))
  rules += expand_rules(LOCAL_HEAD_RULES, local, dims, num_layers=0, torch_prefix=LOCAL_PREFIX,
                        flax_prefix=("local",))
  if cfg.use_global:
    gat = cfg.graph_reranker_config
    rules += expand_rules(GRAPH_RERANKER_RULES, gat, dims, num_layers=int(gat.num_layers),
                          torch_prefix=GLOBAL_PREFIX, flax_prefix=("global",))
  return rules


RenameTable = Tuple[Tuple[str, str], ...]  # ("=" + exact old name | regex, replacement)


def parse_rename_table(table: Union[None, str, os.PathLike, Mapping[str, Any]]) -> RenameTable:
  """Read a user rename table (a JSON file path or its parsed object) into ordered rules.

  Accepted JSON: `{"exact": {old: new, ...}, "regex": [[pattern, replacement], ...]}` (each key
  optional; "regex" may also be an object pattern -> replacement, applied in its order).
  Exact renames apply first, then every regex in order through `re.sub` (so `^model\\.` strips a
  prefix; `\\1` back-references work).

  Args:
    table: None (no renaming), a path to a JSON file, or the parsed object.

  Returns:
    The rules as a tuple of (kind-tagged pattern, replacement); exact names are tagged "=".

  Raises:
    ConfigError: unreadable file, unknown keys, non-string entries or an invalid regex (named).
  """
  if table is None:
    return ()
  if isinstance(table, (str, os.PathLike)):
    try:
      with open(table, encoding="utf-8") as f:
        table = json.load(f)
    except (OSError, json.JSONDecodeError) as e:
      raise ConfigError(f"rename table {os.fspath(table)}: cannot read ({e})") from None
  if not isinstance(table, Mapping):
    raise ConfigError(f"rename table must be a JSON object, got {type(table).__name__}")
  unknown = sorted(set(table) - {"exact", "regex"})
  if unknown:
    raise ConfigError(f"rename table has unknown keys {unknown}; expected 'exact' and/or 'regex'")
  exact = table.get("exact", {})
  if not isinstance(exact, Mapping):
    raise ConfigError("rename table 'exact' must be an object of old name -> new name")
  regex = table.get("regex", [])
  regex = list(regex.items()) if isinstance(regex, Mapping) else regex
  rules = []
  for old, new in exact.items():
    if not isinstance(old, str) or not isinstance(new, str):
      raise ConfigError(f"rename table 'exact' entry {old!r} -> {new!r} is not string -> string")
    rules.append(("=" + old, new))
  for entry in regex:
    if (not isinstance(entry, (list, tuple)) or len(entry) != 2
        or not all(isinstance(x, str) for x in entry)):
      raise ConfigError(f"rename table 'regex' entry {entry!r} is not [pattern, replacement]")
    try:
      re.compile(entry[0])
    except re.error as e:
      raise ConfigError(f"rename table regex {entry[0]!r} is invalid: {e}") from None
    rules.append(("~" + entry[0], entry[1]))
  return tuple(rules)


def apply_rename_table(sd: Mapping[str, Any], table) -> Dict[str, Any]:
  """Rename the keys of a state dict by a rename table (see `parse_rename_table`).

  Args:
    sd: `{name: array}`.
    table: None, a path, a parsed table object or a parsed `RenameTable`.

  Returns:
    A new dict with renamed keys (values shared, not copied).

  Raises:
    CheckpointError: an exact rename names a key the state dict lacks, or two keys end up with
      the same name (both named).
  """
  rules = table if isinstance(table, tuple) else parse_rename_table(table)
  if not rules:
    return dict(sd)
  exact = {p[1:]: new for p, new in rules if p.startswith("=")}
  absent = sorted(k for k in exact if k not in sd)
  if absent:
    raise CheckpointError(f"rename table names keys the checkpoint lacks: {absent}")
  regexes = [(re.compile(p[1:]), new) for p, new in rules if p.startswith("~")]
  out: Dict[str, Any] = {}
  source: Dict[str, str] = {}
  clashes = []
  for key, value in sd.items():
    name = exact.get(key, key)
    for pattern, repl in regexes:
      name = pattern.sub(repl, name)
    if name in out:
      clashes.append(f"{source[name]} and {key} -> {name}")
      continue
    out[name] = value
    source[name] = key
  if clashes:
    raise CheckpointError(f"rename table maps several keys to one name: {clashes}")
  return out


def log_params_from_torch(sd: Mapping[str, Any], cfg, rename=None) -> Params:
  """Convert a full LoG-Reranker torch state dict into `LoGReranker` params.

  Args:
    sd: `{torch name: array}` (e.g. from `load_torch_state_dict`).
    cfg: the `LoGConfig` the checkpoint was trained with.
    rename: optional rename table (path, parsed JSON or `parse_rename_table` output), applied to
      the checkpoint's keys before the strict check.

  Returns:
    `{"local": {...}, "global": {...}}` (no "global" when `cfg.use_global` is False), float32
    NumPy leaves, the tree `log_reranker.init_params` returns.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped key at once.
  """
  sd = apply_rename_table(sd, rename)
  encoder = cfg.local_scorer_config.encoder
  if isinstance(encoder, BertConfig):
    # transformers' BertModel may carry its position / token-type id buffers (older versions
    # save them): tolerated by name when they hold the values transformers rebuilds.
    sd, _ = pop_bert_buffers(sd, encoder, prefixes=(ENCODER_PREFIX,),
                             what="LoG-Reranker state dict")
  return params_from_torch(sd, log_rules(cfg), what="LoG-Reranker state dict")


def log_params_to_torch(params: Mapping[str, Any], cfg, rename=None) -> StateDict:
  """Convert `LoGReranker` params into a torch state dict in the documented layout.

  Args:
    params: `{"local": ..., "global": ...}` as `log_reranker.init_params` returns.
    cfg: its `LoGConfig`.
    rename: optional rename table applied to the output names (to match another layout).

  Returns:
    `{torch name: float32 np.ndarray}`; loads with `strict=True` into the tests' torch reference.

  Raises:
    CheckpointError: naming every missing, unexpected and mis-shaped Flax path.
  """
  sd = params_to_torch(params, log_rules(cfg), what="LoG-Reranker params")
  return apply_rename_table(sd, rename)


def log_key_table(cfg) -> List[Tuple[str, Tuple[int, ...]]]:
  """Return (torch name, torch shape) of every tensor of the full model, in rule order."""
  return [(r.torch_name, r.torch_shape) for r in log_rules(cfg)]

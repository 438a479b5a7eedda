"""What a training config asks of the model: its `LoGConfig`, the packer settings, the encoder of
an HF folder (config, weights, attention dropout) and the tokenizer. Every stage builds its model
from these; they hold no stage state."""

import dataclasses
import os

import jax
import jax.numpy as jnp

from logrerank_jax.data.packing import PackingConfig, grown_buckets
from logrerank_jax.data.tokenization import load_tokenizer
from logrerank_jax.datasets.wordpiece import train_wordpiece_tokenizer
from logrerank_jax.errors import ConfigError
from logrerank_jax.models import log_reranker as lr


def build_model_config(config, vocab_size: int) -> lr.LoGConfig:
  """Return the `LoGConfig` a training config asks for (preset, ablation, dtype, dropout, λ, τ)."""
  if config.model == "paper":
    cfg = lr.LoGConfig.paper()
    if vocab_size > cfg.local.encoder.vocab_size:
      raise ConfigError(f"tokenizer has {vocab_size} tokens but the paper encoder only "
                        f"{cfg.local.encoder.vocab_size}")
  elif config.model == "tiny":
    cfg = lr.LoGConfig.tiny(vocab_size=vocab_size)
  else:
    raise ConfigError(f"config.model must be 'paper' or 'tiny', got {config.model!r}")
  dtype = {"float32": jnp.float32, "bfloat16": jnp.bfloat16}.get(config.dtype)
  if dtype is None:
    raise ConfigError(f"config.dtype must be 'float32' or 'bfloat16', got {config.dtype!r}")
  encoder = cfg.local.encoder.replace(dtype=dtype)
  local = dataclasses.replace(cfg.local, encoder=encoder, dropout=config.dropout,
                              dense_prior=float(config.get("dense_prior", 0.0)),
                              dense_prior_encoding=config.get("dense_prior_encoding", "split"),
                              dense_prior_pooling=config.get("dense_prior_pooling", "sentence"),
                              dense_prior_gradient=bool(config.get("dense_prior_gradient", True)),
                              dense_prior_passage_cls=bool(config.get("dense_prior_passage_cls",
                                                                      True)),
                              score_temperature=float(config.get("score_temperature", 1.0)),
                              local_head_zero_init=bool(config.get("local_head_zero_init", False)))
  gat = dataclasses.replace(cfg.graph_reranker, dropout=config.dropout, dtype=dtype,
                            residual_local=bool(config.get("global_residual", False)))
  graph = dataclasses.replace(cfg.graph, k=config.graph_k, tau_sim=config.tau_sim,
                              delta=config.delta)
  cfg = dataclasses.replace(cfg, local=local, graph_reranker=gat, graph=graph,
                            lambda_role=config.lambda_role, tau=config.listwise_tau)
  if config.ablation:
    cfg = lr.ablation(cfg, config.ablation)
  return cfg


def check_row_fits(config, encoder) -> None:
  """Refuse `config.max_seq_len` beyond the encoder's positions: such a row would index past
  the position table (a gather that XLA clamps without a word). Names both numbers."""
  if config.max_seq_len > encoder.max_positions:
    raise ConfigError(f"config.max_seq_len={config.max_seq_len} exceeds the "
                      f"{encoder.max_positions} positions of the encoder; set "
                      "--config.max_seq_len to at most that")


def packing_config(config, cfg: lr.LoGConfig) -> PackingConfig:
  """Return the packer settings of a training config, checked against the model's encoder."""
  check_row_fits(config, cfg.local.encoder)
  return PackingConfig(row_len=config.max_seq_len, max_query_tokens=config.max_query_tokens)


def forward_packing(pack_cfg: PackingConfig) -> PackingConfig:
  """Packer settings for forward-only passes over whole queries (`fc.compute_features`, the
  reference path the engine's features are tested against): row buckets grown to 1,024 rows, so
  that 4 queries of 50 passages fit one call (the training buckets stop at 128 rows)."""
  return dataclasses.replace(pack_cfg, row_buckets=grown_buckets(pack_cfg.row_buckets, 1024))


def with_attention_dropout(encoder, config):
  """`encoder` (a BERT-family or ModernBERT config) with the training config's
  `encoder_attention_dropout` as its attention-probability dropout; -1 (the default) keeps the
  encoder's own.

  Raises:
    ConfigError: a rate outside [0, 1) other than -1.
  """
  rate = float(config.get("encoder_attention_dropout", -1.0))
  if rate == -1.0:
    return encoder
  if not 0.0 <= rate < 1.0:
    raise ConfigError(f"config.encoder_attention_dropout must be in [0, 1) or -1 (the encoder's "
                      f"own), got {rate}")
  from logrerank_jax.models.encoders.bert import BertConfig  # pylint: disable=g-import-not-at-top
  field = "attention_probs_dropout_prob" if isinstance(encoder, BertConfig) else "attention_dropout"
  return dataclasses.replace(encoder, **{field: rate})


def with_hf_encoder(cfg: lr.LoGConfig, path: str) -> lr.LoGConfig:
  """Replace the encoder config by the one of an HF folder (keeping dtype).

  The folder may be ModernBERT or BERT-family (BERT / RoBERTa / XLM-R; a sentence-transformers
  folder such as all-MiniLM-L6-v2 has config.json at its root): its config.json `model_type`
  decides. The widths that follow the encoder (`g_dim`, the GAT's `d_enc`) follow it
  (`LoGConfig.from_encoder`); everything else stays `cfg`'s.
  """
  from logrerank_jax.models.local_scorer import encoder_config_from_hf  # pylint: disable=g-import-not-at-top
  enc = encoder_config_from_hf(path, dtype=cfg.local.encoder.dtype)
  return lr.LoGConfig.from_encoder(enc, base=cfg)


def hf_encoder_params(path: str, cfg: lr.LoGConfig):
  """Load and convert the encoder weights of an HF folder with the map of `cfg`'s encoder family."""
  from logrerank_jax.convert import (bert_params_from_torch, load_torch_state_dict,  # pylint: disable=g-import-not-at-top
                                     modernbert_params_from_torch)
  convert = {"modernbert": modernbert_params_from_torch,
             "bert": bert_params_from_torch}[cfg.local.encoder_family]
  return convert(load_torch_state_dict(path), cfg.local.encoder)


def encoder_family(cfg) -> str:
  from logrerank_jax.models.local_scorer import encoder_family as fam  # pylint: disable=g-import-not-at-top
  return fam(cfg)


def training_tokenizer(config, workdir: str, records):
  """Load the configured tokenizer, or train a WordPiece one on the training text."""
  if config.tokenizer:
    return load_tokenizer(config.tokenizer)
  if config.init_checkpoint:
    return load_tokenizer(config.init_checkpoint)
  saved = os.path.join(workdir, "tokenizer")
  if os.path.isdir(saved):  # a resumed run keeps the tokenizer it started with
    return load_tokenizer(saved)
  texts = [r.question for r in records] + [s.text for r in records for p in r.passages
                                           for s in p.sentences]
  # The vocabulary is deterministic, so every process builds the same one; only process 0 writes.
  return train_wordpiece_tokenizer(texts, config.tokenizer_vocab_size,
                                   saved if jax.process_index() == 0 else None)

"""The Flax encoder families LoG's local stage runs on: ModernBERT and BERT (BERT, RoBERTa layout).

  hf_common    what both share: activation names, reading a HF config.json, param init
  modernbert   ModernBERT (its config, layers and encoder)
  bert         BERT-family encoder

`from logrerank_jax import ModernBertConfig, ModernBertEncoder, BertConfig, BertEncoder` is the
stable import.
"""

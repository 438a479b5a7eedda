"""The Flax encoder families LoG's local stage runs on: ModernBERT and BERT (BERT, RoBERTa layout).

  hf_common    what both share: activation names, reading a HF config.json, param init
  layers       what both encoders run: the attention core over `models/attention`, LayerNorm,
               segment pooling
  modernbert_config  ModernBERT's config and its HF config.json mapping
  modernbert   ModernBERT (its layers and encoder; re-exports the config)
  bert         BERT-family encoder

`from logrerank_jax import ModernBertConfig, ModernBertEncoder, BertConfig, BertEncoder` is the
stable import.
"""

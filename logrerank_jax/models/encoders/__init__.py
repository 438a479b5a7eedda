"""The Flax encoder families LoG's local stage runs on: ModernBERT and BERT (BERT, RoBERTa layout).

  hf_common    what both configs share: activation names, reading a HF config.json and its
               fields, the checks of `__post_init__` (`EncoderConfig`), param init
  layers       what both encoders run: the attention core over `models/attention`, LayerNorm,
               input checks, segment pooling, the classifier's last layer
  modernbert_config  ModernBERT's config and its HF config.json mapping
  modernbert   ModernBERT (its layers and encoder; re-exports the config)
  bert         BERT-family encoder

`from logrerank_jax import ModernBertConfig, ModernBertEncoder, BertConfig, BertEncoder` is the
stable import.
"""

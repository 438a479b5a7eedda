"""Passage cross-encoder baseline: `logrerank_jax/configs/passage_stage.py`.

The configs are installed with the package; this file keeps `--config configs/passage_stage.py[:variant]`
working in a checkout. Every key is defined and commented there.
"""

from logrerank_jax.configs.passage_stage import get_config  # noqa: F401  pylint: disable=unused-import

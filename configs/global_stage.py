"""Global stage (graph construction + relation-aware GAT, eq 7-16, 23): `logrerank_jax/configs/global_stage.py`.

The configs are installed with the package; this file keeps `--config configs/global_stage.py[:variant]`
working in a checkout. Every key is defined and commented there.
"""

from logrerank_jax.configs.global_stage import get_config  # noqa: F401  pylint: disable=unused-import

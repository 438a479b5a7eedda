"""Local stage (encoder + intent/role heads, eq 1-6, 19-22): `logrerank_jax/configs/local_stage.py`.

The configs are installed with the package; this file keeps `--config configs/local_stage.py[:variant]`
working in a checkout. Every key is defined and commented there.
"""

from logrerank_jax.configs.local_stage import get_config  # noqa: F401  pylint: disable=unused-import

"""The training configs (ml_collections, one `get_config(variant)` per file), installed with the
package so `logrerank train --config local_stage.py:minilm` works without a checkout.

`configs/*.py` in a checkout are the same configs (each imports its `get_config` from here), so
`--config configs/local_stage.py` keeps working; `--config` also takes any file of your own.
"""

"""PyTorch <-> Flax weight conversion: safe checkpoint loading and the ModernBERT name map."""

from logrerank_jax.convert.loading import load_torch_state_dict
from logrerank_jax.convert.modernbert_map import (
    HEAD_MODULES,
    MODERNBERT_ENCODER_RULES,
    SEQUENCE_CLASSIFIER_HEAD_RULES,
    TRANSFORMS,
    ParamRule,
    Rule,
    Transform,
    expand_rules,
    modernbert_dims,
    modernbert_encoder_rules,
    modernbert_params_from_torch,
    modernbert_params_to_torch,
    params_from_torch,
    params_to_torch,
    sequence_classifier_params_from_torch,
    sequence_classifier_params_to_torch,
    sequence_classifier_rules,
)

__all__ = [
    "HEAD_MODULES",
    "MODERNBERT_ENCODER_RULES",
    "SEQUENCE_CLASSIFIER_HEAD_RULES",
    "TRANSFORMS",
    "ParamRule",
    "Rule",
    "Transform",
    "expand_rules",
    "load_torch_state_dict",
    "modernbert_dims",
    "modernbert_encoder_rules",
    "modernbert_params_from_torch",
    "modernbert_params_to_torch",
    "params_from_torch",
    "params_to_torch",
    "sequence_classifier_params_from_torch",
    "sequence_classifier_params_to_torch",
    "sequence_classifier_rules",
]

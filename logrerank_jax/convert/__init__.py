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

from logrerank_jax.convert.log_map import (  # noqa: E402  (full LoG-Reranker map, appended)
    GRAPH_RERANKER_RULES,
    LOCAL_HEAD_RULES,
    apply_rename_table,
    log_dims,
    log_key_table,
    log_params_from_torch,
    log_params_to_torch,
    log_rules,
    parse_rename_table,
)

__all__ += [
    "GRAPH_RERANKER_RULES",
    "LOCAL_HEAD_RULES",
    "apply_rename_table",
    "log_dims",
    "log_key_table",
    "log_params_from_torch",
    "log_params_to_torch",
    "log_rules",
    "parse_rename_table",
]

from logrerank_jax.convert.bert_map import (  # noqa: E402  (BERT-family map, appended)
    BERT_BUFFER_KEYS,
    BERT_CLASSIFIER_HEAD_RULES,
    BERT_ENCODER_RULES,
    BERT_HEAD_MODULES,
    BERT_POOLER_RULES,
    bert_dims,
    bert_encoder_rules,
    bert_params_from_torch,
    bert_params_to_torch,
    bert_pooler_rules,
    bert_sequence_classifier_params_from_torch,
    bert_sequence_classifier_params_to_torch,
    bert_sequence_classifier_rules,
)

__all__ += [
    "BERT_BUFFER_KEYS",
    "BERT_CLASSIFIER_HEAD_RULES",
    "BERT_ENCODER_RULES",
    "BERT_HEAD_MODULES",
    "BERT_POOLER_RULES",
    "bert_dims",
    "bert_encoder_rules",
    "bert_params_from_torch",
    "bert_params_to_torch",
    "bert_pooler_rules",
    "bert_sequence_classifier_params_from_torch",
    "bert_sequence_classifier_params_to_torch",
    "bert_sequence_classifier_rules",
]

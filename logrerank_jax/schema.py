"""Names shared by every layer: roles, span kinds, edge types and the arrays of a packed batch.

One home for each of these constants. The data layer writes batches with these keys, the models
read them, the graph builder emits these edge types, and serving prints these role names; none
of them defines its own copy.
"""

# Roles and query intents share one index order everywhere (DESIGN.md §1).
ROLE_NAMES = ("background", "method", "result")
NUM_ROLES = len(ROLE_NAMES)

# Kind of each entry of a packed batch's span table.
SPAN_NONE, SPAN_QUERY, SPAN_SENTENCE = 0, 1, 2

# Edge types of the sentence graph (eq 8-10): 7 adjacency types from (role of source, role of
# target) -- 1 same-role + 6 directed cross-role -- and one shared similarity type.
NUM_EDGE_TYPES = 8
SIMILARITY_EDGE_TYPE = 7

# Arrays of a packed batch, by what reads them.
TOKEN_KEYS = ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids")  # [R, L]
SPAN_KEYS = ("span_kind", "span_query", "span_node")                                   # [S]
NODE_KEYS = ("node_passage", "node_mask")                                              # [Q, N]
MODEL_KEYS = TOKEN_KEYS + SPAN_KEYS + NODE_KEYS  # everything the full model's forward reads
# Per-node training labels added to a batch by the training data pipeline.
LABEL_KEYS = ("sentence_rank", "passage_rank", "role_target")

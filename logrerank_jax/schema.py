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


def adjacency_edge_type(src_role, dst_role):
  """Return the adjacency edge type of (source role, target role), the one rule of eq 8-9.

  Same role -> 0; the directed cross-role pair (src, dst), src != dst, maps to
  1 + 2 * src + (dst if dst < src else dst - 1), i.e. 1..6. Plain arithmetic, so it works on
  Python ints (the typed results) and elementwise on NumPy / JAX int arrays (`graph/build.py`).
  """
  return (1 + 2 * src_role + dst_role - (dst_role > src_role)) * (src_role != dst_role)


# Readable name of each edge type: 0 same role, 1..6 "source->target" roles, 7 similarity.
EDGE_TYPE_NAMES = (("same role",) + tuple(f"{ROLE_NAMES[s]}->{ROLE_NAMES[d]}"
                                          for s in range(NUM_ROLES) for d in range(NUM_ROLES)
                                          if s != d) + ("similarity",))

# Arrays of a packed batch, by what reads them.
TOKEN_KEYS = ("input_ids", "attention_mask", "segment_ids", "position_ids", "span_ids")  # [R, L]
SPAN_KEYS = ("span_kind", "span_query", "span_node")                                   # [S]
NODE_KEYS = ("node_passage", "node_mask")                                              # [Q, N]
MODEL_KEYS = TOKEN_KEYS + SPAN_KEYS + NODE_KEYS  # everything the full model's forward reads
# Per-node training labels added to a batch by the training data pipeline.
LABEL_KEYS = ("sentence_rank", "passage_rank", "role_target")

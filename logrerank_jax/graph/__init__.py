"""logrerank_jax.graph: typed sentence-graph construction on device."""

from logrerank_jax.graph.build import (NUM_EDGE_TYPES, SIMILARITY_EDGE_TYPE, GraphBuildConfig,
                                       build_sentence_graph, edge_slots_per_query, edge_type)

__all__ = ["GraphBuildConfig", "NUM_EDGE_TYPES", "SIMILARITY_EDGE_TYPE", "build_sentence_graph",
           "edge_slots_per_query", "edge_type"]

"""A LlamaIndex node postprocessor that reranks with LoG and keeps its evidence.

    from logrerank_jax.integrations.llamaindex import LogEvidencePostprocessor
    rerank = LogEvidencePostprocessor(base_url="http://127.0.0.1:8000", api_key=KEY, top_n=3)
    engine = index.as_query_engine(similarity_top_k=20, node_postprocessors=[rerank])
    nodes = rerank.postprocess_nodes(nodes, query_str="Does X cause Y?")

Each kept node (a copy; the input nodes are left as they were) is scored by LoG and gains LoG's
metadata (`log_score`, `log_rank`, `log_index`, `log_sentences` with offsets into the node's
text, `log_context`; see `logrerank_jax.integrations.evidence`). Those keys are excluded from the
text LlamaIndex embeds and shows the LLM, which would otherwise carry every sentence twice.
`base_url=` talks to a running `logrerank serve`; `reranker=` runs a `logrerank_jax.Reranker`
in this process instead. Needs the `llamaindex` extra: pip install "logrerank_jax[llamaindex]".
"""

from typing import Any, List, Optional

try:
  from llama_index.core.bridge.pydantic import Field, SecretStr, model_validator
  from llama_index.core.postprocessor.types import BaseNodePostprocessor
  from llama_index.core.schema import MetadataMode, NodeWithScore, QueryBundle
except ImportError as e:
  raise ImportError(f"logrerank_jax.integrations.llamaindex needs LlamaIndex ({e}): "
                    "pip install \"logrerank_jax[llamaindex]\"") from None

from logrerank_jax.integrations import evidence as ev

_KEYS = ("log_score", "log_rank", "log_index", "log_sentences", "log_context")


class LogEvidencePostprocessor(BaseNodePostprocessor):
  """Keeps the `top_n` best nodes by LoG, each with its evidence sentences in metadata."""

  base_url: Optional[str] = Field(None, description="a running `logrerank serve`")
  api_key: Optional[SecretStr] = Field(None, description="its --api-key (Bearer token)")
  reranker: Any = Field(None, exclude=True, description="or an in-process Reranker")
  top_n: Optional[int] = Field(3, description="nodes kept (None: all, reranked)")
  min_sentence_score: float = Field(0.1, description="evidence sentences scoring at least this")
  max_sentences: Optional[int] = Field(None, description="at most this many per node")
  timeout: float = Field(120.0, description="seconds per server request")

  @model_validator(mode="after")
  def _check(self) -> "LogEvidencePostprocessor":
    ev.check_source(self.base_url, self.reranker)
    ev.check_options(self.top_n, self.min_sentence_score, self.max_sentences)
    return self

  @classmethod
  def class_name(cls) -> str:
    return "LogEvidencePostprocessor"

  def _postprocess_nodes(self, nodes: List[NodeWithScore],
                         query_bundle: Optional[QueryBundle] = None) -> List[NodeWithScore]:
    if query_bundle is None:
      raise ValueError("query_bundle: LoG reranks for a query; pass query_str= or query_bundle=")
    texts = [n.node.get_content(metadata_mode=MetadataMode.NONE) for n in nodes]
    kept = ev.evidence_with(self, query_bundle.query_str, texts)
    out = []
    for k in kept:
      node = nodes[k.index].node.model_copy(deep=True)
      node.metadata.update(k.metadata)
      for excluded in (node.excluded_embed_metadata_keys, node.excluded_llm_metadata_keys):
        excluded.extend(key for key in _KEYS if key not in excluded)
      out.append(NodeWithScore(node=node, score=k.score))
    return out

"""A LangChain document compressor that reranks with LoG and keeps its evidence.

    from langchain_classic.retrievers import ContextualCompressionRetriever
    from logrerank_jax.integrations.langchain import LogEvidenceCompressor
    compressor = LogEvidenceCompressor(base_url="http://127.0.0.1:8000", api_key=KEY, top_n=3)
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)
    docs = retriever.invoke("Does X cause Y?")   # docs[0].metadata["log_sentences"], ...

Each kept `Document` keeps its text and gains LoG's metadata (`log_score`, `log_rank`,
`log_index`, `log_sentences` with offsets into `page_content`, `log_context`; see
`logrerank_jax.integrations.evidence`). `base_url=` talks to a running `logrerank serve`;
`reranker=` runs a `logrerank_jax.Reranker` in this process instead.
Needs the `langchain` extra: pip install "logrerank_jax[langchain]".
"""

import copy
from typing import Any, Optional, Sequence

try:
  from langchain_core.callbacks import Callbacks
  from langchain_core.documents import BaseDocumentCompressor, Document
  from pydantic import ConfigDict, SecretStr, model_validator
except ImportError as e:
  raise ImportError(f"logrerank_jax.integrations.langchain needs LangChain ({e}): "
                    "pip install \"logrerank_jax[langchain]\"") from None

from logrerank_jax.integrations import evidence as ev


class LogEvidenceCompressor(BaseDocumentCompressor):
  """Keeps the `top_n` best documents by LoG, each with its evidence sentences in metadata."""

  base_url: Optional[str] = None       # a running `logrerank serve`, e.g. http://127.0.0.1:8000
  api_key: Optional[SecretStr] = None  # its --api-key (sent as `Authorization: Bearer`)
  reranker: Any = None                 # or an in-process logrerank_jax.Reranker
  top_n: Optional[int] = 3             # None: every document, reranked
  min_sentence_score: float = 0.1      # evidence sentences scoring at least this (Cohere's spans)
  max_sentences: Optional[int] = None  # at most this many per document
  timeout: float = 120.0               # seconds per server request

  model_config = ConfigDict(arbitrary_types_allowed=True, extra="forbid")

  @model_validator(mode="after")
  def _check(self) -> "LogEvidenceCompressor":
    ev.check_source(self.base_url, self.reranker)
    ev.check_options(self.top_n, self.min_sentence_score, self.max_sentences)
    return self

  def compress_documents(self, documents: Sequence[Document], query: str,
                         callbacks: Optional[Callbacks] = None) -> Sequence[Document]:
    """The kept documents, best first: copies with LoG's metadata added."""
    del callbacks  # a reranker reports nothing to LangChain's callbacks
    kept = ev.evidence_with(self, query, [d.page_content for d in documents])
    out = []
    for k in kept:
      doc = documents[k.index]
      out.append(Document(page_content=doc.page_content, id=doc.id,
                          metadata={**copy.deepcopy(doc.metadata), **k.metadata}))
    return out

"""LangChain's clients against a running `logrerank serve`, as LangChain's users have them.

tests/test_frameworks.py runs this in a subprocess whose PYTHONPATH starts with
.ci/langchain_env (langchain-cohere with its own cohere 5; the main environment keeps cohere 7).

Usage: python langchain_client.py JOB.json OUT.json
  JOB: {"url", "key", "query", "texts"}. OUT: {"cohere_version", "cohere_rerank": [{"source",
  "relevance_score"}], "wrong_key_status", "evidence": [{"text", "metadata"}]}; `source` is the
  text's position in JOB's texts (the retriever hands them on in its own order).
"""

import json
import sys

import cohere
from cohere.core.api_error import ApiError
from langchain_classic.retrievers import ContextualCompressionRetriever
from langchain_cohere import CohereRerank
from langchain_core.documents import Document
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore

from logrerank_jax.integrations.langchain import LogEvidenceCompressor


def main(job_path: str, out_path: str) -> None:
  with open(job_path) as f:
    job = json.load(f)
  url, key, texts = job["url"], job["key"], job["texts"]
  store = InMemoryVectorStore(DeterministicFakeEmbedding(size=16))
  store.add_documents([Document(page_content=t, metadata={"source": i})
                       for i, t in enumerate(texts)])
  base = store.as_retriever(search_kwargs={"k": len(texts)})  # every text reaches the reranker

  def retrieve(compressor):
    retriever = ContextualCompressionRetriever(base_compressor=compressor, base_retriever=base)
    return retriever.invoke(job["query"])

  out = {"cohere_version": cohere.__version__}
  docs = retrieve(CohereRerank(base_url=url, cohere_api_key=key, model="logrerank", top_n=3))
  out["cohere_rerank"] = [{"source": d.metadata["source"],
                           "relevance_score": d.metadata["relevance_score"]} for d in docs]
  try:
    retrieve(CohereRerank(base_url=url, cohere_api_key="wrong-" + key, model="logrerank"))
    out["wrong_key_status"] = None
  except ApiError as e:
    out["wrong_key_status"] = e.status_code
  docs = retrieve(LogEvidenceCompressor(base_url=url, api_key=key, top_n=None,
                                        min_sentence_score=0.0))
  out["evidence"] = [{"text": d.page_content, "metadata": d.metadata} for d in docs]
  with open(out_path, "w") as f:
    json.dump(out, f)


if __name__ == "__main__":
  main(*sys.argv[1:])

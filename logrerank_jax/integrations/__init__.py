"""LoG inside RAG frameworks: optional extras that the rest of the library never imports.

  langchain.LogEvidenceCompressor    a LangChain `BaseDocumentCompressor`   (extra `langchain`)
  llamaindex.LogEvidencePostprocessor a LlamaIndex `BaseNodePostprocessor` (extra `llamaindex`)
  evidence                           their framework-free half: LoG's "log" record of a query,
                                     from a running server or an in-process `Reranker`, as kept
                                     documents with their evidence metadata

Import the class from its module (`from logrerank_jax.integrations.langchain import ...`): this
package imports no framework, so one framework installed without the other is enough.
"""

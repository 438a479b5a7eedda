"""Offline dataset adapters: task files to records and pools (never on the engine's input path).

  scholarqabench, scholarqa_cs, pubmed_adapter   ScholarQABench, ScholarQA-CS, PubMedQA readers
  pools, bm25                                    evaluation pools from gold + BM25 negatives
  construction/                                  the paper's Appendix-B training-data construction
  splitter_cases                                 the sentence splitter's tricky cases (a report)
  wordpiece                                      deterministic WordPiece training (tests, demo)
"""

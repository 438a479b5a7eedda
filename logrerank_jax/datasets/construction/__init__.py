"""Training-data construction (the paper's Appendix B), with every model call behind a boundary.

Steps, one module each:
  * `extract`     OpenScholar-style instances -> question, answer, candidate passages;
  * `prompts`     the two versioned annotation prompt templates;
  * `requests`    OpenAI-compatible batch-request JSONL (and an optional endpoint client);
  * `lenient_json` tolerant parsing of annotator output;
  * `roles`       pluggable role sources (`RoleAnnotator`): external facet-model JSONL,
                  a windowed facet-model wrapper, and the offline section/cue heuristic;
  * `consolidate` responses -> validated training records, every defect reported by id;
  * `stats`       the Table 6-shaped statistics report.
See `docs/TRAINING_DATA.md`.
"""

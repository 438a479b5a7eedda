"""Explanation pages: why LoG ranked a passage where it did, seen rather than read.

One self-contained HTML page per reranked record (the question, every passage in LoG's order
with its sentences coloured by role and shaded by score, the local -> global score changes, the
sentence graph of the context units and the units themselves), drawn by one inline JS renderer
from the record's "log" JSON; an index page per run; and the empty form page the HTTP server can
serve at `GET /`, drawing `POST /log/rerank` answers with the same renderer.

    from logrerank_jax import explain
    html = explain.record_page(result)              # RerankResult / RecordError / its dict
    explain.write_record_pages("pages/", enumerate(results)); explain.write_index("pages/", rows)
    explain.form_page("/log/rerank", pools)         # GET / of a server

Sits beside `results` (output formats): it imports no model, training or serving code.
"""

from logrerank_jax.explain.pages import (INDEX_FILE, asset, form_page, index_page, page_file,
                                         page_summary, record_dict, record_page, script_json,
                                         write_index, write_record_pages)

__all__ = ["INDEX_FILE", "asset", "form_page", "index_page", "page_file", "page_summary",
           "record_dict", "record_page", "script_json", "write_index", "write_record_pages"]

"""The context-unit sentence graph of `RerankResult` and the explanation page builder (no browser:
tests/test_explain_browser.py opens the pages). Results are made by `results.make_result` from
hand-set scores, so every count and edge below is known in advance."""

import base64
import dataclasses
import hashlib
import html.parser
import json
import re

import jax.numpy as jnp
import numpy as np
import pytest

from logrerank_jax import explain
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.errors import DataError
from logrerank_jax.graph.build import edge_type
from logrerank_jax.results import (QueryScores, SentenceRef, context_graph, make_result,
                                   record_error)
from logrerank_jax.schema import (EDGE_TYPE_NAMES, NUM_ROLES, ROLE_NAMES, SIMILARITY_EDGE_TYPE,
                                  adjacency_edge_type)

HOSTILE_QUERY = 'Is </script><script>window.__pwned = "query"</script> safe?'
HOSTILE_TITLE = '<img src=x onerror="window.__pwned = \'title\'">'
HOSTILE_SENTENCE = 'It ends </script><!-- here <b>bold</b> & "quoted". '


def hostile_record():
  """A raw input record: 3 usable passages with hostile text, one unusable passage."""
  return {"id": "evil<1>", "input": HOSTILE_QUERY, "ctxs": [
      {"title": HOSTILE_TITLE, "text": "Cells grew. " + HOSTILE_SENTENCE + "Results held."},
      {"title": "Second", "text": "We measured growth. Growth doubled."},
      {"title": "Skipped one", "text": None},
      {"title": "Third", "text": "Background matters. Growth doubled again."}]}


def synthetic_result(local_only=False, flat=False):
  """`make_result` of hand-set scores over `hostile_record()` (8 sentences, passage 2 skipped).

  Node n is the n-th sentence in passage order: P0 S0-2 = nodes 0-2, P1 S0-1 = 3-4,
  P3 S0-1 = 5-6. Roles (argmax) and final scores are set so that the units are nodes 1, 4, 6:
  unit 1 (P0 S1) has predecessor 0, successor 2 and similar 4 and 6; unit 4 (P1 S1) has
  predecessor 3 and similar 1 (the same two-way link as 1-4); unit 6 has none.
  """
  rec = parse_inference_record(hostile_record())
  assert [len(p.sentences) for p in rec.passages] == [3, 2, 0, 2]
  node_passage = np.array([0, 0, 0, 1, 1, 3, 3], np.int32)
  node_sentence = np.array([0, 1, 2, 0, 1, 0, 1], np.int32)
  roles = [0, 1, 2, 1, 1, 0, 2]   # background, method, result, method, method, background, result
  role_probs = np.full((7, NUM_ROLES), 0.1, np.float32)
  role_probs[np.arange(7), roles] = 0.8
  local = np.array([0.30, 0.50, 0.20, 0.40, 0.90, 0.10, 0.60], np.float32)
  final = np.array([0.20, 0.95, 0.30, 0.10, 0.80, 0.40, 0.70], np.float32)
  units = [{"node": 1, "score": 0.95, "role": 1, "predecessor": 0, "successor": 2, "similar": [4, 6]},
           {"node": 4, "score": 0.80, "role": 1, "predecessor": 3, "successor": None, "similar": [1]},
           {"node": 6, "score": 0.70, "role": 2, "predecessor": None, "successor": None, "similar": []}]
  if flat:
    units = [{k: u[k] for k in ("node", "score", "role")} for u in units]
  if local_only:
    final = local
  scores = QueryScores(
      record=rec, node_passage=node_passage, node_sentence=node_sentence, local_score=local,
      global_score=None if local_only else final, final_score=final, role_probs=role_probs,
      context=units, passage_info=[(1, [], []), (1, [], []), (0, [], []), (1, [], [])])
  return make_result(scores, line=3)


def test_edge_type_rule_has_one_home():
  """schema's rule (the typed results) equals graph/build.py's jnp rule on every role pair, and
  the names say source->target."""
  src, dst = np.meshgrid(np.arange(3), np.arange(3), indexing="ij")
  on_device = np.asarray(edge_type(jnp.asarray(src), jnp.asarray(dst)))
  for s in range(3):
    for d in range(3):
      t = int(adjacency_edge_type(s, d))
      assert t == on_device[s, d]
      assert EDGE_TYPE_NAMES[t] == ("same role" if s == d else f"{ROLE_NAMES[s]}->{ROLE_NAMES[d]}")
  assert sorted({int(adjacency_edge_type(s, d)) for s in range(3) for d in range(3)}) == list(range(7))
  assert EDGE_TYPE_NAMES[SIMILARITY_EDGE_TYPE] == "similarity" and len(EDGE_TYPE_NAMES) == 8


def test_context_graph_nodes_and_edges():
  res = synthetic_result()
  assert res.passage_ranking == (0, 1, 3, 2)                 # by best final score; skipped last
  g = res.graph
  # Nodes: the units' sentences and expansions, each once, grouped by passage in LoG's order.
  assert [(n.passage, n.sentence) for n in g.nodes] == [(0, 0), (0, 1), (0, 2), (1, 0), (1, 1), (3, 1)]
  assert [n.id for n in g.nodes] == list(range(6))
  assert [n.unit for n in g.nodes] == [None, 0, None, None, 1, 2]
  assert [n.role for n in g.nodes] == ["background", "method", "result", "method", "method", "result"]
  head = g.nodes[1]
  assert head.text == HOSTILE_SENTENCE.strip() and head.rank == 1
  assert head.local_score == pytest.approx(0.5) and head.global_score == pytest.approx(0.95)
  edges = [(e.source, e.target, e.kind, e.type, e.type_name) for e in g.edges]
  # background->method, method->result, method--method similarity, method--result similarity,
  # then unit 2's method->method (same role) predecessor; its similar link to node 1 is the
  # two-way edge already listed.
  assert edges == [(0, 1, "adjacency", 1, "background->method"),
                   (1, 2, "adjacency", 4, "method->result"),
                   (1, 4, "similarity", 7, "similarity"),
                   (1, 5, "similarity", 7, "similarity"),
                   (3, 4, "adjacency", 0, "same role")]
  out = res.to_dict()
  assert list(out) == ["line", "id", "query", "error", "query_truncated", "ranked_sentences",
                       "passage_ranking", "passages", "context", "graph"]
  assert set(out["graph"]) == {"nodes", "edges"}
  assert set(out["graph"]["nodes"][0]) == {"id", "passage", "sentence", "text", "role", "local_score",
                                          "global_score", "score", "rank", "unit"}
  assert out["graph"]["edges"][0] == {"source": 0, "target": 1, "kind": "adjacency", "type": 1,
                                      "type_name": "background->method"}
  json.dumps(out, allow_nan=False)  # JSON-ready


def test_flat_list_and_local_only_graphs():
  flat = synthetic_result(flat=True)
  assert [(n.passage, n.sentence, n.unit) for n in flat.graph.nodes] == [(0, 1, 0), (1, 1, 1), (3, 1, 2)]
  assert flat.graph.edges == ()
  assert "similar" not in flat.to_dict()["context"][0]
  local = synthetic_result(local_only=True)
  assert all(n.global_score is None for n in local.graph.nodes)
  assert [n.score for n in local.graph.nodes] == [n.local_score for n in local.graph.nodes]


def test_a_unit_naming_an_unranked_sentence_is_an_error():
  """The graph is built from the units' sentences; one that is not ranked cannot be drawn."""
  res = synthetic_result()
  ghost = dataclasses.replace(res.context[0], sentence=SentenceRef(5, 0, "not ranked"))
  with pytest.raises(DataError, match="passage 5 sentence 0, which is not a ranked sentence"):
    context_graph((ghost,), res.ranked_sentences, res.passage_ranking)


class _Blocks(html.parser.HTMLParser):
  """Collects the page's <script> and <style> elements with their raw text."""

  def __init__(self):
    super().__init__()
    self.blocks, self.tags, self._open = [], [], None

  def handle_starttag(self, tag, attrs):
    self.tags.append(tag)
    if tag in ("script", "style"):
      self._open = (tag, dict(attrs), [])

  def handle_data(self, data):
    if self._open:
      self._open[2].append(data)

  def handle_endtag(self, tag):
    if self._open and tag == self._open[0]:
      self.blocks.append((tag, self._open[1], "".join(self._open[2])))
      self._open = None


def parse_page(text):
  p = _Blocks()
  p.feed(text)
  return p


def test_page_embeds_the_record_and_no_text_escapes_it():
  res = synthetic_result()
  page = explain.record_page(res, index_href="index.html")
  parsed = parse_page(page)
  scripts = [(a.get("type"), a.get("id"), body) for t, a, body in parsed.blocks if t == "script"]
  # Exactly the three blocks the builder writes: hostile text opened no element of its own.
  assert [(t, i) for t, i, _ in scripts] == [("application/json", "log-record"),
                                             ("application/json", "log-page"), (None, None)]
  assert "img" not in parsed.tags and "b" not in parsed.tags
  assert json.loads(scripts[0][2]) == json.loads(json.dumps(res.to_dict()))
  assert json.loads(scripts[1][2]) == {"indexHref": "index.html"}
  assert "<" not in scripts[0][2] and ">" not in scripts[0][2] and "&" not in scripts[0][2]
  assert scripts[2][2] == explain.asset("explain.js")
  # The title is escaped HTML text.
  assert "<title>LoG: Is &lt;/script&gt;&lt;script&gt;" in page


def test_csp_allows_exactly_the_inline_script_and_style():
  page = explain.record_page(synthetic_result())
  csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]+)"', page).group(1)
  parsed = parse_page(page)
  digest = lambda s: base64.b64encode(hashlib.sha256(s.encode()).digest()).decode()  # noqa: E731
  js = [b for t, a, b in parsed.blocks if t == "script" and "type" not in a]
  css = [b for t, a, b in parsed.blocks if t == "style"]
  assert len(js) == 1 and len(css) == 1
  assert f"script-src 'sha256-{digest(js[0])}'" in csp
  assert f"style-src 'sha256-{digest(css[0])}'" in csp
  assert "default-src 'none'" in csp and "connect-src 'none'" in csp
  for name in ("explain.js", "explain.css"):
    assert "</script" not in explain.asset(name).lower() and "</style" not in explain.asset(name).lower()
  assert "connect-src 'self'" in explain.form_page()


def test_error_record_page_and_index():
  err = record_error({"id": 7, "input": HOSTILE_QUERY}, "in.jsonl:4: " + HOSTILE_TITLE, line=4)
  page = explain.record_page(err)
  rec = json.loads([b for t, a, b in parse_page(page).blocks if a.get("id") == "log-record"][0])
  assert rec == {"line": 4, "id": "7", "query": HOSTILE_QUERY, "error": "in.jsonl:4: " + HOSTILE_TITLE}
  assert "<title>LoG (not processed): " in page and "img" not in parse_page(page).tags
  ok = synthetic_result()
  rows = [explain.page_summary(ok, explain.page_file(0)), explain.page_summary(err, '"><x')]
  assert rows[0]["skipped"] == [(2, "text is null")] and rows[0]["top_passage"] == 0
  index = explain.index_page(rows)
  tags = parse_page(index).tags
  assert tags.count("tr") == 3 and "img" not in tags and "x" not in tags
  assert 'href="record-00001.html"' in index and "1 skipped: P3 (text is null)" in index
  assert "error: in.jsonl:4: &lt;img" in index


def test_bad_input_is_a_clear_error():
  rec = synthetic_result().to_dict()
  del rec["graph"]
  with pytest.raises(DataError, match=r"line 3 .*has no 'graph'"):
    explain.record_page(rec)
  with pytest.raises(DataError, match="not valid JSON"):
    explain.script_json({"x": float("nan")})
  with pytest.raises(DataError, match="expected a result"):
    explain.record_page(["not", "a", "record"])


def test_html_option_of_rerank_cli_is_declared():
  """`tools/rerank.py --html` parses (the full CLI run is in tests/test_explain_browser.py)."""
  from test_rerank_cli import load_tool  # pylint: disable=g-import-not-at-top
  args = load_tool().parse_args(["--checkpoint", "m", "--input", "i", "--output", "o", "--html", "d"])
  assert args.html == "d"

"""Issue 43, part 4: RAG frameworks against a real `logrerank serve` process over a socket.

The frameworks' own clients (LangChain's `CohereRerank` in a `ContextualCompressionRetriever`,
LlamaIndex's Jina and TEI rerank postprocessors) and the library's evidence classes
(`logrerank_jax.integrations`: a LangChain compressor, a LlamaIndex postprocessor) call one
server process per module, started with an API key (a tiny random LoG model on real SciFact
abstracts, one of them with non-ASCII text: offsets are Python string positions). An in-process
`Reranker` with the same settings gives the reference scores, and drives the postprocessor's
in-process mode.

LangChain runs as its users have it: langchain-cohere 0.6 pins cohere<6, the main environment
needs cohere 7 (relevant_spans), so LangChain lives in .ci/langchain_env (a `pip install
--target` folder that .ci/run builds) and runs in a subprocess with that folder first on its
PYTHONPATH. Without the folder the LangChain tests fail, naming the command that builds it.

Tolerance: scores through the server against the in-process `Reranker` within 1e-5, as
tests/test_serving.py (the same query packed into other calls runs another float32 program).
"""

import importlib
import json
import os
import pathlib
import subprocess
import sys

import httpx
import pytest

from logrerank_jax import engine
from logrerank_jax.data.inference_input import parse_inference_record
from logrerank_jax.data.sentences import split_sentences
from logrerank_jax.integrations import evidence as ev
from test_inference import make_pools, make_tiny_model
from test_serving import ServerProcess

ROOT = pathlib.Path(__file__).resolve().parent.parent
LANGCHAIN_ENV = ROOT / ".ci" / "langchain_env"
LANGCHAIN_INSTALL = ("python -m pip install --target .ci/langchain_env "
                     "-r .ci/langchain_requirements.txt")
KEY = "frameworks-test-key"
TOL = 1e-5  # module docstring
# One row bucket and one node bucket (the eleven documents' 45 sentences fit 64 nodes): two
# shapes to compile on each side.
SETTINGS = dict(row_len=256, row_buckets=(8,), node_buckets=(64,), queries_per_batch=1,
                max_query_tokens=24)
FLAGS = ["--row-len", "256", "--row-buckets", "8", "--node-buckets", "64",
         "--queries-per-batch", "1", "--max-query-tokens", "24"]
FRAMEWORKS = ("langchain", "langchain_core", "langchain_classic", "langchain_cohere",
              "llama_index")


def _serve_command():
  """`logrerank serve` through this environment's console script (else its module)."""
  exe = pathlib.Path(sys.executable).parent / "logrerank"
  return (str(exe), "serve") if exe.exists() else (sys.executable, "-m",
                                                    "logrerank_jax.cli.main", "serve")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
  tmp = tmp_path_factory.mktemp("frameworks")
  pools = make_pools()[0]
  model = make_tiny_model(tmp / "model", pools)
  server = ServerProcess(model, tmp, "--api-key", KEY, flags=FLAGS, command=_serve_command())
  try:
    yield model, server, pools
  finally:
    server.stop()


@pytest.fixture(scope="module")
def local(setup):
  """The in-process reference (built while the server warms up)."""
  return engine.Reranker.from_pretrained(setup[0], **SETTINGS)


@pytest.fixture(scope="module")
def server(setup, local):
  setup[1].wait_ready()
  return setup[1]


@pytest.fixture(scope="module")
def docs(setup):
  """A SciFact claim and its pools' ten distinct abstracts (their first four sentences), plus
  one with non-ASCII text (an astral-plane emoji is one Python character, two UTF-16 units)."""
  pools = setup[2]
  texts = list(dict.fromkeys(c["text"] for p in pools for c in p["ctxs"]))
  texts = [t[:split_sentences(t)[:4][-1].end] for t in texts]
  texts.append("Résumé 🧬 — naïve T cells in β-cell autoimmunity. " + texts[0])
  return pools[0]["input"], texts


def _local_scores(local, query, texts):
  return {p.index: p.score for p in local.rank(query, texts)}


def _assert_top(results, want, n):
  """`results` [(index, score)] are n of the best by `want` (near-ties may swap), scored as
  `want` within TOL, best first."""
  assert len(results) == n
  cut = sorted(want.values(), reverse=True)[n - 1]
  for index, score in results:
    assert abs(score - want[index]) <= TOL, (index, score, want[index])
    assert want[index] >= cut - TOL
  scores = [s for _, s in results]
  assert scores == sorted(scores, reverse=True)


def _assert_evidence(text, meta, want_score, min_score=0.0):
  """One kept document's LoG metadata against its text and the in-process score."""
  assert abs(meta["log_score"] - want_score) <= TOL
  sentences = meta["log_sentences"]
  for s in sentences:
    assert text[s["start"]:s["end"]] == s["text"]
    assert s["score"] >= min_score
  assert [s["score"] for s in sentences] == sorted((s["score"] for s in sentences), reverse=True)
  if min_score == 0.0:  # every sentence of the engine's split, the best one scoring the document
    split = parse_inference_record({"query": "q", "ctxs": [text]}).passages[0].sentences
    assert sorted((s["start"], s["end"]) for s in sentences) == [(x.start, x.end) for x in split]
    assert sentences[0]["score"] == meta["log_score"]
  for unit in meta["log_context"]:
    assert unit["passage"] == meta["log_index"]
    assert unit["text"] in text


# ------------------------------------------------------------------------------------ LangChain

@pytest.fixture(scope="module")
def langchain_run(server, docs, tmp_path_factory):
  """tests/workers/langchain_client.py's answers (one subprocess for every LangChain check)."""
  if not (LANGCHAIN_ENV / "langchain_cohere").is_dir():
    pytest.fail(f"{LANGCHAIN_ENV} is missing (LangChain's own environment: langchain-cohere "
                f"pins cohere<6); build it from the repository root with: {LANGCHAIN_INSTALL}")
  tmp = tmp_path_factory.mktemp("langchain")
  query, texts = docs
  (tmp / "job.json").write_text(json.dumps({"url": server.url, "key": KEY, "query": query,
                                            "texts": texts}))
  env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(LANGCHAIN_ENV), str(ROOT)]))
  proc = subprocess.run([sys.executable, str(ROOT / "tests" / "workers" / "langchain_client.py"),
                         str(tmp / "job.json"), str(tmp / "out.json")],
                        env=env, cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr[-4000:]
  return json.loads((tmp / "out.json").read_text())


def test_langchain_cohere_rerank_in_a_compression_retriever(langchain_run, local, docs):
  """`langchain_cohere.CohereRerank(base_url=...)` (cohere 5's v2 client) keeps LoG's top 3."""
  assert langchain_run["cohere_version"].startswith("5."), langchain_run["cohere_version"]
  want = _local_scores(local, *docs)
  got = [(r["source"], r["relevance_score"]) for r in langchain_run["cohere_rerank"]]
  _assert_top(got, want, 3)
  assert langchain_run["wrong_key_status"] == 401


def test_langchain_compressor_carries_log_evidence(langchain_run, local, docs):
  """`LogEvidenceCompressor` in a `ContextualCompressionRetriever`: every document, LoG's order,
  each with its sentences (offsets slice `page_content`), score and context units."""
  want = _local_scores(local, *docs)
  out = langchain_run["evidence"]
  assert len(out) == len(docs[1])
  assert [d["metadata"]["log_rank"] for d in out] == list(range(1, len(out) + 1))
  _assert_top([(d["metadata"]["source"], d["metadata"]["log_score"]) for d in out], want,
              len(out))
  for d in out:
    assert d["text"] == docs[1][d["metadata"]["source"]]  # the text is kept whole
    _assert_evidence(d["text"], d["metadata"], want[d["metadata"]["source"]])
  assert any(d["metadata"]["log_context"] for d in out)
  # A unit's expansions name documents by `log_index`, their position as the compressor got them.
  by_index = {d["metadata"]["log_index"]: d["text"] for d in out}
  refs = [r for d in out for u in d["metadata"]["log_context"]
          for r in (u["predecessor"], u["successor"], *u["similar"]) if r is not None]
  assert refs and all(r["text"] in by_index[r["passage"]] for r in refs)


# ------------------------------------------------------------------------------------ LlamaIndex

def _nodes(texts, metadata=True):
  """Retrieved nodes. JinaRerank sends a node's metadata with its text (MetadataMode.EMBED), so
  its nodes carry none: the server scores the same texts as the reference."""
  from llama_index.core.schema import NodeWithScore, TextNode  # pylint: disable=g-import-not-at-top
  return [NodeWithScore(node=TextNode(text=t, id_=f"doc-{i}",
                                      metadata={"source": i} if metadata else {}), score=0.5)
          for i, t in enumerate(texts)]


def test_llamaindex_jina_and_tei_rerank_against_the_server(server, local, docs):
  """LlamaIndex's own Jina (POST /v1/rerank) and TEI (POST /rerank) postprocessors."""
  from llama_index.postprocessor.jinaai_rerank import JinaRerank  # pylint: disable=g-import-not-at-top
  from llama_index.postprocessor.tei_rerank import TextEmbeddingInference  # pylint: disable=g-import-not-at-top
  query, texts = docs
  want = _local_scores(local, query, texts)
  clients = [JinaRerank(base_url=server.url + "/v1", api_key=KEY, model="logrerank", top_n=3),
             TextEmbeddingInference(base_url=server.url, auth_token=f"Bearer {KEY}", top_n=3)]
  for client in clients:
    out = client.postprocess_nodes(_nodes(texts, metadata=False), query_str=query)
    _assert_top([(int(n.node.node_id.split("-")[1]), n.score) for n in out], want, 3)


def test_llamaindex_postprocessor_server_and_in_process(server, local, docs):
  """`LogEvidencePostprocessor` through the server and in process: the same nodes, metadata
  and scores; the input nodes untouched; the evidence kept out of the LLM's and embedder's text."""
  from llama_index.core.schema import MetadataMode  # pylint: disable=g-import-not-at-top
  from logrerank_jax.integrations.llamaindex import LogEvidencePostprocessor  # pylint: disable=g-import-not-at-top
  query, texts = docs
  want = _local_scores(local, query, texts)
  opts = dict(top_n=4, min_sentence_score=0.3, max_sentences=2)
  nodes = _nodes(texts)
  outs = [LogEvidencePostprocessor(base_url=server.url, api_key=KEY, **opts)
          .postprocess_nodes(nodes, query_str=query),
          LogEvidencePostprocessor(reranker=local, **opts).postprocess_nodes(nodes, query_str=query)]
  assert all(n.node.metadata == {"source": i} and n.score == 0.5 for i, n in enumerate(nodes))
  for out in outs:
    _assert_top([(n.node.metadata["source"], n.score) for n in out], want, 4)
    for n in out:
      meta = n.node.metadata
      assert n.node.node_id == f"doc-{meta['source']}" and meta["log_index"] == meta["source"]
      assert len(meta["log_sentences"]) <= 2
      _assert_evidence(n.node.text, meta, want[meta["source"]], min_score=0.3)
      for mode in (MetadataMode.LLM, MetadataMode.EMBED):
        assert "log_" not in n.node.get_content(metadata_mode=mode)
  assert any(n.node.metadata["log_sentences"] for n in outs[0])
  via_server, in_process = ([(n.node.node_id, n.node.metadata) for n in out] for out in outs)
  assert [i for i, _ in via_server] == [i for i, _ in in_process]
  for (_, a), (_, b) in zip(via_server, in_process):
    assert [(s["start"], s["end"]) for s in a["log_sentences"]] == \
        [(s["start"], s["end"]) for s in b["log_sentences"]]
    assert [u["sentence"] for u in a["log_context"]] == [u["sentence"] for u in b["log_context"]]


def test_wrong_key_and_bad_options_are_one_line_errors(server, docs):
  from logrerank_jax.integrations.llamaindex import LogEvidencePostprocessor  # pylint: disable=g-import-not-at-top
  query, texts = docs
  wrong = LogEvidencePostprocessor(base_url=server.url, api_key="wrong")
  with pytest.raises(ev.LogEvidenceError, match=r"/log/rerank: HTTP 401: invalid API key$"):
    wrong.postprocess_nodes(_nodes(texts), query_str=query)
  for kwargs, words in [({}, "neither"), ({"base_url": server.url, "reranker": object()}, "both"),
                        ({"base_url": server.url, "top_n": 0}, "top_n: must be at least 1"),
                        ({"base_url": server.url, "min_sentence_score": 2.0},
                         "min_sentence_score: must be in [0, 1]"),
                        ({"base_url": server.url, "max_sentences": 0}, "max_sentences")]:
    with pytest.raises(ValueError, match=words.replace("[", r"\[")):
      LogEvidencePostprocessor(**kwargs)


# --------------------------------------------------------------------------------- the extras

@pytest.mark.parametrize("module,hidden,extra", [
    ("langchain", "langchain_core", "langchain"),
    ("llamaindex", "llama_index.core.bridge.pydantic", "llamaindex")])
def test_a_missing_framework_names_its_extra(monkeypatch, module, hidden, extra):
  name = f"logrerank_jax.integrations.{module}"
  monkeypatch.delitem(sys.modules, name, raising=False)
  monkeypatch.setitem(sys.modules, hidden, None)  # `import` of a None entry: ImportError
  with pytest.raises(ImportError, match=rf'pip install "logrerank_jax\[{extra}\]"$'):
    importlib.import_module(name)


def test_the_library_never_imports_the_frameworks():
  """Only logrerank_jax.integrations imports LangChain or LlamaIndex, and nothing imports it."""
  import grimp  # pylint: disable=g-import-not-at-top  (import-linter's graph, the dev extra)
  graph = grimp.build_graph("logrerank_jax", "logrerank_bench", include_external_packages=True,
                            cache_dir=None)
  # The graph sees a framework import even where the framework is not installed (this env has
  # no LangChain), so the check below can fail.
  assert "langchain_core" in graph.find_modules_directly_imported_by(
      "logrerank_jax.integrations.langchain")
  assert "llama_index" in graph.find_modules_directly_imported_by(
      "logrerank_jax.integrations.llamaindex")
  bad = sorted((m, i) for m in graph.modules if not m.startswith("logrerank_jax.integrations")
               for i in graph.find_modules_directly_imported_by(m)
               if i.split(".")[0] in FRAMEWORKS or i.startswith("logrerank_jax.integrations"))
  assert not bad, bad


def test_evidence_of_a_record_that_failed_is_an_error():
  with pytest.raises(ev.LogEvidenceError, match="could not rerank these documents: boom"):
    ev.rerank({"error": "boom"}, 1, None, 0.1, None)
  with pytest.raises(ev.LogEvidenceError, match="not the 2 documents sent"):
    ev.rerank({"error": None, "passage_ranking": [0], "ranked_sentences": [], "context": []},
              2, None, 0.1, None)

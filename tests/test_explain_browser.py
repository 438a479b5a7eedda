"""The explanation pages in a real browser: Debian's headless Chromium (`apt-get install
chromium`; .ci/run does it) driven by Playwright with `executable_path`, no browser download.

`tools/rerank.py --html` reranks real pools with a tiny random model (its scores mean nothing;
the counts are what is checked): a shipped 50-paragraph demo pool, a 200-paragraph pool (the
distinct paragraphs of the first shipped pools, real PubMed text) with hostile text and two
unusable passages, and a malformed line. Each page
must make no request and log no console error, and draw exactly what the JSON output holds:
passage blocks in LoG's order, evidence and expansion sentences, graph nodes and edges, the
moved-most marks, a role legend; keyboard focus reaches the graph nodes and shows their text.
"""

import json
import pathlib

import pytest

from logrerank_jax import explain
from logrerank_jax.data.pool_files import expand_pools
from test_explain import HOSTILE_SENTENCE, HOSTILE_TITLE, synthetic_result
from test_inference import make_pools, make_tiny_model
from test_rerank_cli import load_tool, read_jsonl

ROOT = pathlib.Path(__file__).resolve().parent.parent
DEMO = ROOT / "logrerank_jax" / "demo_data" / "paragraphs"
MOVED_MOST = 5   # explain.js: sentences marked as moved most by the graph stage


def load_screenshot_tool():
  import importlib.util  # pylint: disable=g-import-not-at-top
  spec = importlib.util.spec_from_file_location("explain_screenshot",
                                                ROOT / "tools" / "explain_screenshot.py")
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def demo_pools(count):
  """The first `count` shipped test pools: PubMedQA questions, 50 candidate paragraphs each."""
  return expand_pools(read_jsonl(DEMO / "test_pools.jsonl")[:count],
                      read_jsonl(DEMO / "corpus.jsonl"))


def paragraph_pool(size):
  """The first pool's question with `size` distinct paragraphs of the first shipped pools (in
  pool order: its own 50 candidates first). Paragraphs, not whole abstracts, keep the tiny
  model's tokens (and the test's time) down: 277 vs 890 tokens a passage measured under the
  test vocabulary."""
  pools, seen, ctxs = demo_pools(8), set(), []
  for pool in pools:
    for c in pool["ctxs"]:
      if c["text"] not in seen:
        seen.add(c["text"])
        ctxs.append(c)
  assert len(ctxs) >= size, len(ctxs)
  return {"id": "pool200", "input": pools[0]["input"], "ctxs": ctxs[:size]}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """One `tools/rerank.py --html` run: (page folder, output records)."""
  tmp = tmp_path_factory.mktemp("explain_run")
  model = make_tiny_model(tmp / "model", make_pools()[0])  # the tests' shared tiny model
  pool50 = demo_pools(1)[0]
  assert len(pool50["ctxs"]) == 50
  pool200 = paragraph_pool(200)
  big = pool200["ctxs"]
  big[3] = dict(big[3], title=HOSTILE_TITLE)
  big[5] = dict(big[5], text=big[5]["text"] + " " + HOSTILE_SENTENCE)
  big[198], big[199] = {"title": "no text", "text": None}, {"title": "a number", "text": 7}
  inp = tmp / "in.jsonl"
  inp.write_text("\n".join([json.dumps(pool50), json.dumps(pool200), '{"input": "q", "ctxs": ['])
                 + "\n", encoding="utf-8")
  html_dir, out = tmp / "html", tmp / "out.jsonl"
  rc = load_tool().main(["--checkpoint", model, "--input", str(inp), "--output", str(out),
                         "--html", str(html_dir), "--row-len", "512", "--no-progress",
                         "--no-compilation-cache"])
  assert rc == 2  # one record with skipped passages, one error record
  records = read_jsonl(out)
  assert [len(r.get("passages", ())) for r in records] == [50, 200, 0]
  return html_dir, records, pool50


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
  with load_screenshot_tool().chromium(str(tmp_path_factory.mktemp("chromium_profile"))) as ctx:
    yield ctx


def open_page(context, path):
  """Load a page file; return (page, log of console errors and requests)."""
  page = context.new_page()
  log = {"errors": [], "requests": []}
  page.on("console", lambda m: log["errors"].append(m.text) if m.type == "error" else None)
  page.on("pageerror", lambda e: log["errors"].append(str(e)))
  page.on("request", lambda r: log["requests"].append(r.url))
  url = pathlib.Path(path).resolve().as_uri()
  page.goto(url)
  page.wait_for_selector("html[data-rendered=painted]")
  log["url"] = url
  return page, log


def assert_offline_and_clean(page, log):
  assert log["errors"] == []
  assert log["requests"] == [log["url"]]        # the page itself, nothing else
  assert page.evaluate("performance.getEntriesByType('resource').length") == 0


COUNTS_JS = """() => ({
  passages: [...document.querySelectorAll('.passage')].map(d => Number(d.dataset.index)),
  skipped: [...document.querySelectorAll('.passage.skipped .skip-reason')].map(p => p.textContent),
  sentences: document.querySelectorAll('.sent').length,
  evidence: document.querySelectorAll('.sent.evidence').length,
  expansion: document.querySelectorAll('.sent.expansion').length,
  moved: [...document.querySelectorAll('.sent.moved')].map(li => li.id),
  nodes: document.querySelectorAll('svg.graph g.node').length,
  adjacency: document.querySelectorAll('svg.graph .edge.adjacency').length,
  similarity: document.querySelectorAll('svg.graph .edge.similarity').length,
  units: document.querySelectorAll('.units > li').length,
  legend: [...document.querySelectorAll('.legend .role')].map(li => li.dataset.role),
  titles: [...document.querySelectorAll('.p-title')].map(t => t.textContent),
  texts: [...document.querySelectorAll('.s-text')].map(t => t.textContent),
  imgs: document.querySelectorAll('img').length,
  pwned: window.__pwned === undefined ? null : String(window.__pwned),
})"""


def moved_most(rec):
  """The sentences explain.js must mark: largest rank change from local to final scores."""
  sents = rec["ranked_sentences"]
  if not sents or any(s["global_score"] is None for s in sents):
    return []
  by_local = sorted(sents, key=lambda s: (-s["local_score"], s["passage"], s["sentence"]))
  local_rank = {(s["passage"], s["sentence"]): i + 1 for i, s in enumerate(by_local)}
  shifts = [(local_rank[(s["passage"], s["sentence"])] - s["rank"], s) for s in sents]
  shifts = sorted([x for x in shifts if x[0] != 0], key=lambda x: (-abs(x[0]), x[1]["rank"]))
  return sorted(f"s-{s['passage']}-{s['sentence']}" for _, s in shifts[:MOVED_MOST])


def check_record_page(page, rec):
  """Everything drawn equals the record's JSON."""
  c = page.evaluate(COUNTS_JS)
  g = rec["graph"]
  assert c["passages"] == rec["passage_ranking"]
  assert c["skipped"] == [f"Skipped, not scored: {p['skipped']}. Kept, unranked, at the end."
                          for p in sorted((p for p in rec["passages"] if p["skipped"]),
                                          key=lambda p: rec["passage_ranking"].index(p["index"]))]
  assert c["sentences"] == len(rec["ranked_sentences"])
  assert c["evidence"] == len(rec["context"]) == sum(n["unit"] is not None for n in g["nodes"])
  assert c["expansion"] == sum(n["unit"] is None for n in g["nodes"])
  assert c["nodes"] == len(g["nodes"])
  assert c["adjacency"] == sum(e["kind"] == "adjacency" for e in g["edges"])
  assert c["similarity"] == sum(e["kind"] == "similarity" for e in g["edges"])
  assert c["units"] == len(rec["context"])
  assert sorted(c["moved"]) == moved_most(rec)
  assert c["legend"] == ["background", "method", "result"]
  assert c["titles"] == [rec["passages"][p]["title"] or "(untitled)" for p in rec["passage_ranking"]]
  assert sorted(c["texts"]) == sorted(s["text"] for s in rec["ranked_sentences"])
  assert c["imgs"] == 0 and c["pwned"] is None
  return c


def check_keyboard(page, rec):
  """Tab reaches a graph node within a few presses; its text and score show; Enter shows the
  sentence in its passage."""
  for _ in range(15):
    page.keyboard.press("Tab")
    if page.evaluate("document.activeElement.matches('svg.graph g.node')"):
      break
  else:
    pytest.fail("15 Tab presses did not reach a graph node")
  node = rec["graph"]["nodes"][int(page.evaluate("document.activeElement.dataset.node"))]
  info = " ".join(page.inner_text("#node-info").split())
  assert " ".join(node["text"].split()) in info and f"final {node['score']:.3f}" in info
  page.keyboard.press("Enter")
  assert page.evaluate("document.activeElement.id") == f"s-{node['passage']}-{node['sentence']}"
  last = rec["graph"]["nodes"][-1]
  page.hover(f"svg.graph g.node[data-node='{last['id']}']")
  assert " ".join(last["text"].split()) in " ".join(page.inner_text("#node-info").split())


def test_real_pools_render_what_the_json_holds(run, browser, tmp_path):
  html_dir, records, _ = run
  for number, rec in enumerate(records[:2]):
    page, log = open_page(browser, html_dir / explain.page_file(number))
    counts = check_record_page(page, rec)
    check_keyboard(page, rec)
    assert_offline_and_clean(page, log)
    page.screenshot(path=str(tmp_path / f"explain_{len(rec['passages'])}.png"))
    page.close()
    assert counts["nodes"] > 0 and len(rec["context"]) == 4  # LoGConfig.tiny().context_k == 4
  big = records[1]
  assert {p["index"]: p["skipped"] for p in big["passages"] if p["skipped"]} == {
      198: "text is null", 199: "text is int"}
  assert HOSTILE_TITLE in [p["title"] for p in big["passages"]]
  # The error record: its message, plainly.
  page, log = open_page(browser, html_dir / explain.page_file(2))
  assert page.inner_text(".error-record .error-message") == records[2]["error"]
  assert page.evaluate("document.querySelectorAll('svg.graph, .passage').length") == 0
  assert_offline_and_clean(page, log)
  page.close()
  # The index links every page, error and skipped passages shown.
  page, log = open_page_static(browser, html_dir / explain.INDEX_FILE)
  hrefs = page.evaluate("[...document.querySelectorAll('table.records a')].map(a => a.getAttribute('href'))")
  assert hrefs == [explain.page_file(i) for i in range(3)]
  assert "2 skipped" in page.inner_text("table.records") and "error:" in page.inner_text("table.records")
  assert_offline_and_clean(page, log)
  page.close()


def open_page_static(context, path):
  """Load a page without the renderer (the index)."""
  page = context.new_page()
  log = {"errors": [], "requests": []}
  page.on("console", lambda m: log["errors"].append(m.text) if m.type == "error" else None)
  page.on("pageerror", lambda e: log["errors"].append(str(e)))
  page.on("request", lambda r: log["requests"].append(r.url))
  log["url"] = pathlib.Path(path).resolve().as_uri()
  page.goto(log["url"])
  return page, log


def test_200_passage_render_time(run, browser):
  """Measured, reported (pytest -s prints it), not asserted: the issue asks for under 2 s."""
  html_dir, records, _ = run
  times = []
  for _ in range(3):
    page, log = open_page(browser, html_dir / explain.page_file(1))
    t = page.evaluate("window.logExplainTiming")
    times.append((round(t["renderMs"]), round(t["paintedAt"])))
    assert_offline_and_clean(page, log)
    page.close()
  print(f"\n200-passage page: renderer ms, painted at ms since navigation start: {times}")
  assert all(painted >= render for render, painted in times)


def test_local_only_flat_and_hostile_synthetic_pages(browser, tmp_path):
  """The local-only model (no global score: no moved marks) and the flat-list ablation (no
  expansion, no edge), both over hostile question, title and sentence text."""
  for name, res in (("local", synthetic_result(local_only=True)), ("flat", synthetic_result(flat=True)),
                    ("full", synthetic_result())):
    path = tmp_path / f"{name}.html"
    path.write_text(explain.record_page(res), encoding="utf-8")
    page, log = open_page(browser, path)
    rec = json.loads(json.dumps(res.to_dict()))
    c = check_record_page(page, rec)
    assert page.inner_text(".question") == rec["query"]
    assert HOSTILE_TITLE in c["titles"] and HOSTILE_SENTENCE.strip() in c["texts"]
    if name == "local":
      assert c["moved"] == [] and "local-only model" in page.inner_text(".summary")
    if name == "flat":
      assert c["adjacency"] == c["similarity"] == 0 and page.locator(".units .flat").count() == 3
    if name == "full":
      assert c["moved"] and c["adjacency"] == 3 and c["similarity"] == 2
    check_keyboard(page, rec)
    assert_offline_and_clean(page, log)
    page.close()


def test_form_page_draws_a_log_rerank_answer_with_the_same_renderer(run, browser):
  """The server's GET / page: a demo pool is posted as one input record and the answer drawn.
  The origin is Playwright-routed: no server, and no request leaves the browser."""
  _, records, pool50 = run
  posted, seen = [], []

  def handle(route):
    seen.append(route.request.url)
    if route.request.url.endswith("/log/rerank"):
      posted.append(json.loads(route.request.post_data))
      route.fulfill(status=200, content_type="application/json", body=json.dumps(records[0]))
    else:
      route.fulfill(status=200, content_type="text/html; charset=utf-8",
                    body=explain.form_page("/log/rerank", [pool50]))

  page = browser.new_page()
  errors = []
  page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
  page.route("**/*", handle)
  page.goto("http://explain.test/")
  page.select_option("select[name=pool]", "0")
  page.click("button[type=submit]")
  page.wait_for_selector("#result svg.graph")
  assert posted[0]["question"] == pool50["input"]
  assert [p["text"] for p in posted[0]["passages"]] == [c["text"].strip() for c in pool50["ctxs"]]
  check_record_page(page, records[0])
  assert seen == ["http://explain.test/", "http://explain.test/log/rerank"] and errors == []
  page.close()

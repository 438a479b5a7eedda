"""Screenshot one record's explanation page (the README's docs/explain_page.png).

  python tools/explain_screenshot.py --checkpoint runs/demo/global \
      --pools logrerank_jax/demo_data/paragraphs/test_pools.jsonl --output docs/explain_page.png \
      [--corpus FILE] [--num-pools 3] [--record 0] [--html-dir DIR] [--width 1400 --height 1250]

The same code path as `logrerank rerank --html` (tools/rerank.py): the first `--num-pools`
pools (id-only demo pools are resolved against `--corpus`, by default `corpus.jsonl` beside the
pools file) are reranked by that command into `--html-dir` (default: a temporary folder), then record `--record`'s
page is opened in Debian's headless Chromium (Playwright with `executable_path`; no browser is
downloaded), its first graph node is focused with the keyboard (so the picture shows the node
panel) and the viewport is saved as a PNG.
"""

import argparse
import contextlib
import json
import os
import pathlib
import shutil
import sys
import tempfile

# Launch flags: headless, no sandbox (CI containers run as root), and none of Chromium's own
# background traffic (component updates, sync, field trials), so a page that makes no request
# leaves the browser silent.
CHROMIUM_ARGS = ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync")


def chromium_path() -> str:
  """Debian's Chromium (`apt-get install chromium`), or $LOGRERANK_CHROMIUM."""
  return os.environ.get("LOGRERANK_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"


@contextlib.contextmanager
def chromium(user_data_dir: str, width: int = 1400, height: int = 1000):
  """A Playwright browser context on Debian's headless Chromium with a fresh profile folder."""
  from playwright.sync_api import sync_playwright  # pylint: disable=g-import-not-at-top

  exe = chromium_path()
  if not os.path.exists(exe):
    raise FileNotFoundError(f"no Chromium at {exe}: apt-get install chromium (or set "
                            "LOGRERANK_CHROMIUM)")
  with sync_playwright() as pw:
    context = pw.chromium.launch_persistent_context(
        user_data_dir, executable_path=exe, headless=True, args=list(CHROMIUM_ARGS),
        viewport={"width": width, "height": height}, device_scale_factor=1)
    try:
      yield context
    finally:
      context.close()


def read_pools(path: str, corpus: str, count: int) -> list:
  """The first `count` pools of `path`, id-only pools resolved against `corpus`."""
  from logrerank_jax.data.pool_files import expand_pools  # pylint: disable=g-import-not-at-top

  with open(path, encoding="utf-8") as f:
    pools = [json.loads(line) for line in f if line.strip()][:count]
  if any("ctx_ids" in p for p in pools):
    corpus = corpus or os.path.join(os.path.dirname(os.path.abspath(path)), "corpus.jsonl")
    with open(corpus, encoding="utf-8") as f:
      pools = expand_pools(pools, [json.loads(line) for line in f if line.strip()])
  return pools


def screenshot(page_path: str, output: str, width: int, height: int) -> None:
  """Open a record page, focus its first graph node by keyboard and save the viewport."""
  with tempfile.TemporaryDirectory() as profile, chromium(profile, width, height) as context:
    page = context.new_page()
    page.goto(pathlib.Path(page_path).resolve().as_uri())
    page.wait_for_selector("html[data-rendered=painted]")
    for _ in range(20):  # Tab to the first graph node, as a keyboard user would
      page.keyboard.press("Tab")
      if page.evaluate("document.activeElement.matches('g.node')"):
        break
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=output)


def main(argv=None) -> int:
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  p.add_argument("--checkpoint", required=True, help="model folder or training workdir")
  p.add_argument("--pools", required=True, help="pools JSONL (OpenScholar, or id-only demo pools)")
  p.add_argument("--corpus", default=None, help="corpus of id-only pools (default: beside --pools)")
  p.add_argument("--num-pools", type=int, default=3, help="pools to rerank (default 3)")
  p.add_argument("--record", type=int, default=0, help="which reranked pool to shoot (0-based)")
  p.add_argument("--output", required=True, help="PNG to write")
  p.add_argument("--html-dir", default=None, help="keep the pages here (default: a temp folder)")
  p.add_argument("--width", type=int, default=1400)
  p.add_argument("--height", type=int, default=1250)
  args = p.parse_args(argv)
  if not 0 <= args.record < args.num_pools:
    p.error("--record must be in [0, --num-pools)")
  with tempfile.TemporaryDirectory() as tmp:
    pools = read_pools(args.pools, args.corpus, args.num_pools)
    inp = os.path.join(tmp, "pools.jsonl")
    with open(inp, "w", encoding="utf-8") as f:
      f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in pools)
    html_dir = args.html_dir or os.path.join(tmp, "html")
    from logrerank_jax.cli import rerank  # pylint: disable=g-import-not-at-top
    rc = rerank.main(["--checkpoint", args.checkpoint, "--input", inp, "--output",
                      os.path.join(tmp, "out.jsonl"), "--html", html_dir, "--no-progress"])
    if rc == 1:
      return 1
    from logrerank_jax.explain import page_file  # pylint: disable=g-import-not-at-top
    screenshot(os.path.join(html_dir, page_file(args.record)), args.output, args.width, args.height)
  print(f"explain_screenshot: {args.output}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""tools/plot_training.py turns metrics.jsonl into a PNG and names bad lines."""

import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def _write(path, records):
  path.mkdir()
  (path / "metrics.jsonl").write_text("\n".join(json.dumps(r) for r in records) + "\n")


def test_writes_png(tmp_path):
  _write(tmp_path / "run", [{"event": "start", "step": 0}] + [
      {"event": "train", "step": s, "loss": 3.0 / s, "rank": 2.0 / s, "role": 1.0 / s}
      for s in range(1, 6)] + [{"event": "val", "step": 5, "ndcg@10": 50.0, "map@10": 40.0}])
  out = tmp_path / "curves.png"
  res = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_training.py"), "--workdir",
                        str(tmp_path / "run"), "--output", str(out)], capture_output=True, text=True)
  assert res.returncode == 0, res.stderr
  assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 5000


def test_bad_line_is_named(tmp_path):
  (tmp_path / "run").mkdir()
  (tmp_path / "run" / "metrics.jsonl").write_text('{"event": "train", "step": 1, "loss": 1}\n{oops\n')
  res = subprocess.run([sys.executable, str(ROOT / "tools" / "plot_training.py"), "--workdir",
                        str(tmp_path / "run"), "--output", str(tmp_path / "x.png")],
                       capture_output=True, text=True)
  assert res.returncode != 0 and "metrics.jsonl:2" in res.stderr

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


def test_ema_smooth_known_answers():
  """TensorBoard's debiased EMA: hand-computed values, None passes through, 0 is the identity."""
  sys.path.insert(0, str(ROOT / "tools"))
  from plot_training import ema_smooth
  # weight 0.5: s1 = 0.5*2 / (1-0.5) = 2; s2 = (0.5*1 + 0.5*4) / (1-0.25) = 2.5/0.75;
  # s3 (after None) = (0.5*2.5 + 0.5*1) / (1-0.125) = 1.75/0.875 = 2.
  got = ema_smooth([2.0, 4.0, None, 1.0], 0.5)
  assert got[2] is None
  assert [round(v, 12) for v in (got[0], got[1], got[3])] == [2.0, round(2.5 / 0.75, 12), 2.0]
  assert ema_smooth([3.0, 1.0, 7.0], 0.0) == [3.0, 1.0, 7.0]
  # A constant series stays constant at any weight (the debiasing is exact).
  assert all(abs(v - 5.0) < 1e-12 for v in ema_smooth([5.0] * 50, 0.99))
  try:
    ema_smooth([1.0], 1.0)
  except ValueError as e:
    assert "[0, 1)" in str(e)
  else:
    raise AssertionError("weight 1.0 accepted")

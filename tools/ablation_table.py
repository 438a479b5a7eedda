"""The ablation table of `tools/ablate.sh`: each variant's nDCG@10 on both pool sets, and full
LoG minus the variant, paired per question (mean [95 % bootstrap interval] (wins/losses)).

  python tools/ablation_table.py --main runs/demo --ablations runs/ablate [--markdown out.md]
"""

import argparse
import json
import os
import sys

# Row order: the paper's Table 12 order where it has the variant.
VARIANTS = ("w/o global", "w/o cross-passage edges", "w/o intra-passage edges",
            "w/o edge types", "w/o role head", "w/o intent head")
SETS = (("eval", "evidence pools"), ("eval_cs", "ScholarQA-CS"))


def slug(name: str) -> str:
  """The folder name tools/ablate.sh gives a variant."""
  s = "".join(c if c.isalnum() and c.isascii() and not c.isupper() else "_" for c in name)
  return s[4:] if s.startswith("w_o_") else s


def _load(path):
  with open(os.path.join(path, "metrics.json"), encoding="utf-8") as f:
    return json.load(f)


def table(main: str, ablations: str) -> str:
  k = None
  head = "| model |" + "".join(f" {name}: nDCG@10 | LoG minus model [95 % CI] |" for _, name in SETS)
  rows = [head, "| --- |" + " ---: | ---: |" * len(SETS)]
  full = [_load(os.path.join(main, sub)) for sub, _ in SETS]
  rows.append("| **LoG (full)** | " + " | ".join(
      f"**{m['metrics']['log']['ndcg@10']:.2f}** | " for m in full) + " |")
  for variant in VARIANTS:
    d = os.path.join(ablations, slug(variant))
    if not os.path.isdir(d):
      continue
    cells = []
    for sub, _ in SETS:
      m = _load(os.path.join(d, sub))
      k = m["k"]
      p = m["paired"]
      if p["against"] != "full":
        raise SystemExit(f"ablation_table: {d}/{sub} is paired against {p['against']!r}, not 'full'")
      s = p["systems"]["log"]
      cells.append(f"{m['metrics']['log'][f'ndcg@{k}']:.2f} | {s['mean']:+.2f} "
                   f"[{s['low']:+.2f}, {s['high']:+.2f}] ({s['wins']}/{s['losses']})")
    rows.append(f"| {variant} | " + " | ".join(cells) + " |")
  return "\n".join(rows) + ("\n\nBrackets: the questions full LoG wins/loses against the "
                            "variant.\n")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--main", default="runs/demo", help="the main job's run folder")
  ap.add_argument("--ablations", default="runs/ablate", help="tools/ablate.sh's output folder")
  ap.add_argument("--markdown", default=None, help="also write the table here")
  args = ap.parse_args(argv)
  try:
    out = table(args.main, args.ablations)
  except (OSError, KeyError, ValueError) as e:
    print(f"ablation_table: {e}", file=sys.stderr)
    return 1
  print(out)
  if args.markdown:
    with open(args.markdown, "w", encoding="utf-8") as f:
      f.write(out)
  return 0


if __name__ == "__main__":
  sys.exit(main())

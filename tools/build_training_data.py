"""Build LoG-Reranker training data from OpenScholar-style instances (the paper's Appendix B).

  # 1. keep the single-/multi-paper QA instances, split into question, answer, passages
  python tools/build_training_data.py extract --input os_train.jsonl --output work/instances.jsonl
  # 2. one passage-ranking request per instance, one sentence-ranking request per passage
  python tools/build_training_data.py prepare --instances work/instances.jsonl \
      --output work/requests.jsonl [--model gpt-4o-2024-08-06]
  # (run the batch anywhere OpenAI-compatible; or, with a server at hand:)
  python tools/build_training_data.py send --requests work/requests.jsonl \
      --endpoint http://localhost:8000 --output work/responses.jsonl
  # 3-5. consolidate, attach roles, validate, report statistics
  python tools/build_training_data.py consolidate --instances work/instances.jsonl \
      --responses work/responses.jsonl --output work/train.jsonl [--roles heuristic|ROLES.jsonl]

`consolidate` writes TRAIN, TRAIN.defects.jsonl (every defect by id),
TRAIN.stats.json and TRAIN.stats.md (Table 6 shape), and validates TRAIN with
`logrerank_jax.data.records.validate_training_file`. See docs/TRAINING_DATA.md.
"""

import argparse
import json
import os
import sys

from logrerank_jax.data import records as records_lib
from logrerank_jax.datasets.construction import consolidate as consolidate_lib
from logrerank_jax.datasets.construction import extract as extract_lib
from logrerank_jax.datasets.construction import requests as requests_lib
from logrerank_jax.datasets.construction import roles as roles_lib
from logrerank_jax.errors import LogRerankError


def parse_args(argv=None):
  """Parse the command line."""
  p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  sub = p.add_subparsers(dest="command", required=True)
  e = sub.add_parser("extract", help="parse instances and keep the QA subsets")
  e.add_argument("--input", required=True, help="OpenScholar-style JSONL")
  e.add_argument("--output", required=True, help="instances JSONL")
  e.add_argument("--single-name", action="append", default=None,
                 help="substring of a single-paper QA 'dataset' name (repeatable; default 'single')")
  e.add_argument("--multi-name", action="append", default=None,
                 help="substring of a multi-paper QA 'dataset' name (repeatable; default 'multi')")
  r = sub.add_parser("prepare", help="write the batch-request JSONL")
  r.add_argument("--instances", required=True)
  r.add_argument("--output", required=True, help="requests JSONL (+ .manifest.json)")
  r.add_argument("--model", default=requests_lib.RequestOptions.model)
  r.add_argument("--temperature", type=float, default=0.0)
  r.add_argument("--max-tokens", type=int, default=4096)
  r.add_argument("--no-json-mode", action="store_true", help="omit response_format")
  s = sub.add_parser("send", help="send requests to an OpenAI-compatible server (optional)")
  s.add_argument("--requests", required=True)
  s.add_argument("--endpoint", required=True, help="server base URL")
  s.add_argument("--output", required=True, help="responses JSONL (appended)")
  s.add_argument("--api-key-env", default=None, help="name of the environment variable holding the key")
  s.add_argument("--rps", type=float, default=2.0, help="requests per second")
  s.add_argument("--retries", type=int, default=5)
  c = sub.add_parser("consolidate", help="responses -> validated training records + statistics")
  c.add_argument("--instances", required=True)
  c.add_argument("--responses", required=True, help="batch-output JSONL")
  c.add_argument("--output", required=True, help="training JSONL")
  c.add_argument("--roles", default="heuristic",
                 help="'heuristic' (section labels / cue phrases) or a facet-model roles JSONL")
  c.add_argument("--min-words", type=int, default=consolidate_lib.ConsolidateOptions.min_words)
  return p.parse_args(argv)


def _extract(args) -> int:
  """Run `extract`."""
  rule = extract_lib.SubsetRule(single=tuple(args.single_name or ("single",)),
                                multi=tuple(args.multi_name or ("multi",)))
  instances, report = extract_lib.extract_instances(args.input, rule)
  extract_lib.write_instances(args.output, instances)
  with open(args.output + ".report.json", "w", encoding="utf-8") as f:
    json.dump(report.to_json(), f, indent=2)
  for kind, iid, detail in report.defects:
    print(f"extract: {kind} [{iid}]: {detail}", file=sys.stderr)
  print(f"extract: {report.lines} lines -> {len(instances)} instances "
        f"(single-paper {report.kept['single_paper']}, multi-paper {report.kept['multi_paper']}), "
        f"{report.passages} passages; skipped {sum(report.skipped_datasets.values())} of other "
        f"datasets, {len(report.defects)} defects; wrote {args.output}")
  return 0


def _prepare(args) -> int:
  """Run `prepare`."""
  opts = requests_lib.RequestOptions(model=args.model, temperature=args.temperature,
                                     max_tokens=args.max_tokens, json_mode=not args.no_json_mode)
  reqs = requests_lib.build_requests(extract_lib.read_instances(args.instances), opts)
  manifest = requests_lib.write_requests(args.output, reqs, opts)
  print(f"prepare: {len(reqs)} requests; wrote {args.output} and {manifest}")
  return 0


def _send(args) -> int:
  """Run `send`."""
  reqs = [obj for _, obj, err in extract_lib.iter_jsonl(args.requests) if err is None]
  key = os.environ.get(args.api_key_env) if args.api_key_env else None
  counts = requests_lib.send_requests(reqs, args.endpoint, args.output, api_key=key,
                                      max_retries=args.retries, requests_per_second=args.rps)
  print(f"send: {counts['ok']} ok, {counts['failed']} failed; appended to {args.output}")
  return 0 if counts["failed"] == 0 else 2


def _consolidate(args) -> int:
  """Run `consolidate`."""
  instances = extract_lib.read_instances(args.instances)
  if args.roles == "heuristic":
    annotator = roles_lib.SectionCueAnnotator()
  else:
    annotator = roles_lib.JsonlRoleSource(args.roles)
  defects: list = []
  responses = consolidate_lib.read_responses(args.responses, defects)
  result = consolidate_lib.consolidate(
      instances, responses, annotator,
      consolidate_lib.ConsolidateOptions(min_words=args.min_words), defects)
  records_lib.write_training_file(args.output, result.records)
  # The output must pass the same validator a training run applies.
  _, report = records_lib.validate_training_file(args.output)
  consolidate_lib.write_defects(args.output + ".defects.jsonl", result.defects)
  stats = result.stats.to_json()
  stats["defects"] = result.defect_counts()
  if isinstance(annotator, roles_lib.SectionCueAnnotator):
    stats["role_sources"] = dict(annotator.sources)
  with open(args.output + ".stats.json", "w", encoding="utf-8") as f:
    json.dump(stats, f, indent=2)
  with open(args.output + ".stats.md", "w", encoding="utf-8") as f:
    f.write(result.stats.table())
  print(result.stats.table(), end="")
  print(f"consolidate: {report.n_records} valid records; defects {result.defect_counts()}; "
        f"wrote {args.output} (+ .defects.jsonl, .stats.json, .stats.md)")
  return 0


def main(argv=None) -> int:
  """Run the CLI; return the exit status."""
  args = parse_args(argv)
  run = {"extract": _extract, "prepare": _prepare, "send": _send,
         "consolidate": _consolidate}[args.command]
  try:
    return run(args)
  except (LogRerankError, OSError) as e:
    print(f"build_training_data: error: {e}", file=sys.stderr)
    return 1


if __name__ == "__main__":
  sys.exit(main())

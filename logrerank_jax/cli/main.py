"""The `logrerank` command: train, rerank, evaluate, serve and convert LoG-Reranker models.

  logrerank train --config local_stage[:tiny] --workdir DIR   (then global_stage)
  logrerank rerank --checkpoint MODEL_OR_WORKDIR --input in.jsonl --output out.jsonl
  logrerank evaluate --pools pools.jsonl --checkpoint MODEL_OR_WORKDIR --out-dir eval/
  logrerank serve --checkpoint MODEL_OR_WORKDIR [--port 8000]
  logrerank convert --hf-model HF_DIR --output OUT

Each command is one module, logrerank_jax/cli/<command>.py, with `main(argv, prog) -> exit
status`, imported only when that command runs: `logrerank --help` loads no JAX, and `logrerank
train` names a bad config before JAX loads. The scripts tools/train.py, rerank.py, evaluate.py,
serve.py and convert_torch.py run the same code (`python tools/rerank.py ARGS` is `logrerank
rerank ARGS`); their messages name the script, as they always have.
"""

import argparse
import importlib
import sys

# command -> (module, the line `logrerank --help` shows for it)
COMMANDS = {
    "train": ("logrerank_jax.cli.train",
              "train one LoG-Reranker stage (absl flags: --config FILE[:variant] --workdir DIR)"),
    "rerank": ("logrerank_jax.cli.rerank",
               "rerank passages at the sentence level (JSONL in, JSONL out; --html pages)"),
    "evaluate": ("logrerank_jax.cli.evaluate",
                 "Recall / MAP / nDCG @k of rerankers side by side on pools with qrels"),
    "serve": ("logrerank_jax.cli.serve",
              "serve a model over HTTP (Cohere, Jina/vLLM, TEI and LoG rerank routes)"),
    "calibrate": ("logrerank_jax.cli.calibrate",
                  "fit calibrated scores (calibration.json) on validation pools"),
    "convert": ("logrerank_jax.cli.convert",
                "convert PyTorch checkpoints to model folders, and back"),
}


def build_parser() -> argparse.ArgumentParser:
  """The top-level parser: its help lists the commands; each command parses its own flags."""
  p = argparse.ArgumentParser(prog="logrerank", description=__doc__.split("\n")[0],
                              epilog="`logrerank COMMAND --help` lists a command's flags.")
  sub = p.add_subparsers(title="commands", metavar="COMMAND", dest="command", required=True)
  for name, (_, summary) in COMMANDS.items():
    sub.add_parser(name, help=summary, add_help=False)
  return p


def main(argv=None) -> int:
  """Run `logrerank COMMAND ARGS` (argv None: the console script's own arguments); return the
  exit status.

  A command's messages name it `logrerank COMMAND` when run from the console script; called
  with an explicit argv (tools/<script>.py does), argparse names the script as before.
  """
  prog = None
  if argv is None:
    argv, prog = sys.argv[1:], "logrerank"
  if argv and argv[0] in COMMANDS:
    module = importlib.import_module(COMMANDS[argv[0]][0])
    return module.main(list(argv[1:]), prog=f"{prog} {argv[0]}" if prog else None)
  parser = build_parser()
  parser.parse_args(argv)  # --help, or a usage error naming the commands; both exit
  parser.error("the command comes first: logrerank COMMAND [ARGS]")
  return 2


if __name__ == "__main__":
  sys.exit(main())

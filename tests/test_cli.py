"""The `logrerank` console command: its five commands, run from outside the repository, and the
tools/ scripts that run the same code (`python tools/rerank.py ARGS` is `logrerank rerank ARGS`)."""

import contextlib
import io
import os
import pathlib
import re
import runpy
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent
# command -> the script under tools/ that runs it
SCRIPTS = {"train": "train.py", "rerank": "rerank.py", "evaluate": "evaluate.py",
           "serve": "serve.py", "convert": "convert_torch.py"}
COLUMNS = "100"  # argparse wraps help text to the terminal width: the same for every run here


def console_command() -> list:
  """The installed `logrerank` of this interpreter's environment (else the one on PATH, else
  `python -m logrerank_jax.cli.main`)."""
  beside = pathlib.Path(sys.executable).parent / "logrerank"
  found = str(beside) if beside.exists() else shutil.which("logrerank")
  return [found] if found else [sys.executable, "-m", "logrerank_jax.cli.main"]


def run(cmd, cwd, timeout=120):
  """Run `cmd` in `cwd` with no repository on the path (PYTHONPATH unset)."""
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  env.update(COLUMNS=COLUMNS, JAX_PLATFORMS="cpu")
  return subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
                        check=False)


def same_text(text: str, progs) -> str:
  """`text` with each program name in `progs` replaced by PROG and whitespace collapsed (argparse
  wraps the usage lines by the length of the program name)."""
  for prog in progs:
    text = text.replace(prog, "PROG")
  return " ".join(text.split())


def test_top_level_help_lists_the_commands(tmp_path):
  res = run(console_command() + ["--help"], tmp_path)
  assert res.returncode == 0, res.stderr
  assert res.stdout.startswith("usage: logrerank ")
  listed = re.findall(r"^    (\w+) ", res.stdout, flags=re.M)
  assert listed == list(SCRIPTS), res.stdout
  bad = run(console_command() + ["no-such-command"], tmp_path)
  assert bad.returncode == 2 and "invalid choice: 'no-such-command'" in bad.stderr


LIGHT = """
import sys
from logrerank_jax.cli.main import main
for argv in (["--help"], ["rerank", "--help"], ["evaluate", "--help"], ["serve", "--help"],
             ["convert", "--help"]):
  with open("/dev/null", "w") as sink:
    sys.stdout = sink
    try:
      main(argv)
    except SystemExit as e:
      sys.stdout = sys.__stdout__
      print(argv[0], e.code, "jax" in sys.modules or "fastapi" in sys.modules)
try:
  main(["train", *sys.argv[1:]])  # config overrides are looked up in sys.argv (ml_collections)
except SystemExit as e:
  print("train", e.code, "jax" in sys.modules)
"""


def test_help_and_a_bad_config_do_not_import_jax(tmp_path):
  """`logrerank --help`, every command's `--help` and a bad training config answer before JAX
  (and the HTTP stack) is imported: the flags' defaults come from `engine.defaults` and
  `serving.settings`, which import neither, and the engine package resolves its names on first
  use. (absl prints `train --help` before any training module loads.)"""
  config = f"{ROOT / 'configs' / 'local_stage.py'}:tiny"
  res = run([sys.executable, "-c", LIGHT, "--config", config, "--config.not_a_key=1",
             "--workdir", str(tmp_path / "w")], tmp_path)
  assert res.stdout.splitlines() == ["--help 0 False", "rerank 0 False", "evaluate 0 False",
                                     "serve 0 False", "convert 0 False", "train 2 False"], (
                                         res.stdout, res.stderr)
  assert "unknown config key 'not_a_key'" in res.stderr
  assert not (tmp_path / "w").exists()


@pytest.mark.parametrize("command", ["train", "rerank", "evaluate", "serve", "convert"])
def test_command_help_from_any_folder_equals_its_script(command, tmp_path, monkeypatch):
  """`logrerank COMMAND --help` from a folder outside the repository works and prints what
  `python tools/<script>.py --help` prints, but for the program name (the script keeps its own,
  as before)."""
  console = console_command()
  res = run(console + [command, "--help"], tmp_path)
  script = ROOT / "tools" / SCRIPTS[command]
  if command == "train":
    # absl: --help exits 1 and names the program by sys.argv[0]; a fresh process each.
    assert res.returncode == 1, res.stderr
    tool = run([sys.executable, str(script), "--help"], tmp_path)
    assert tool.returncode == 1, tool.stderr
    assert "--config: Training config file" in res.stdout and "--workdir" in res.stdout
    script_text = tool.stdout
    progs = [str(script), console[-1], str(ROOT / "logrerank_jax" / "cli" / "main.py")]
  else:
    assert res.returncode == 0, res.stderr
    assert res.stdout.startswith(f"usage: logrerank {command} "), res.stdout
    # The script runs in this process: cheaper than a second interpreter per command.
    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.setenv("COLUMNS", COLUMNS)
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exit_info:
      runpy.run_path(str(script), run_name="__main__")
    assert exit_info.value.code == 0
    script_text = out.getvalue()
    assert script_text.startswith(f"usage: {script.name} "), script_text
    progs = [f"logrerank {command}", script.name]
  assert same_text(res.stdout, progs) == same_text(script_text, progs)


def test_train_config_names_a_shipped_config_or_a_file_in_one_line(tmp_path, capsys):
  """`--config local_stage:tiny` names the shipped file from any folder; a path that is neither a
  file nor a shipped name is one line naming it and the shipped ones, before absl or JAX run
  (ml_collections alone would print a traceback)."""
  from logrerank_jax.cli import train  # pylint: disable=g-import-not-at-top
  shipped = train.resolve_config_arg(["--config", "local_stage:tiny", "--workdir", "w"])
  assert shipped[1] == os.path.join(train.PACKAGED_CONFIGS, "local_stage.py") + ":tiny"
  assert train.resolve_config_arg([f"--config={tmp_path}"]) == [f"--config={tmp_path}"]
  status = train.main(["--config", "configs/no_such_stage.py:tiny", "--workdir",
                       str(tmp_path / "w")])
  err = capsys.readouterr().err.strip().splitlines()
  assert status == 2 and len(err) == 1, err
  assert err[0].startswith("error: ConfigError: --config configs/no_such_stage.py:tiny: no such "
                           "file"), err
  assert "global_stage, local_stage, passage_stage" in err[0]
  assert not (tmp_path / "w").exists()

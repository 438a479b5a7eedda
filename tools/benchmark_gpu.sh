#!/usr/bin/env bash
# One prepared GPU run (issue 25): every figure in one process and one JSON, in under 8 minutes.
#
#   tools/benchmark_gpu.sh --prepare                 # here: fill runs/gpu_carry/ (needs PyPI)
#   OUT=/tmp/gpu_bench tools/benchmark_gpu.sh        # on the GPU machine: base size, bf16
#   OUT=/tmp/dry tools/benchmark_gpu.sh --dry-run    # CPU rehearsal: tiny size, same code path
#
# Writes $OUT/gpu.json (logrerank_bench/device_run.py: attention_work_efficiency per path; LoG device,
# host and end-to-end ms per 50-passage query on real ScholarQABench pools; encoder tokens/s and
# bf16 MFU; local-stage training tokens/s; JAX and torch peak memory; transformers'
# ModernBertModel with sdpa timed interleaved in the same process), $OUT/gpu_log.txt,
# $OUT/versions.txt and $OUT/nvidia_smi.txt. The JSON is rewritten after every section, so a
# run cut short keeps what it measured; sections not started by --time-budget are skipped, and
# `timeout` stops the whole run at $LIMIT seconds (default 450: 7.5 minutes).
#
# The dry run pins attention_impl="pallas_gpu" and sets LOGRERANK_PALLAS_INTERPRET=1, so the GPU
# kernel (forward and backward) runs in Pallas interpret mode on the CPU: the path a GPU takes
# with "auto", at tiny size.
#
# Installs nothing on the GPU machine from the network (it has none). What its image lacks
# travels in runs/gpu_carry/ (git-ignored; carry it to the device): pure-Python deps (jraph,
# pysbd, ml_collections) copied from this environment, the sentencex wheel for the GPU image's
# Python 3.12 (installed there with pip --no-index into /tmp/gpu_site), and the ScholarQABench
# SciFact and PubMed files. In a worktree, point SHARED_DATA at ../shared/data/scholarqabench.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=runs/gpu_carry
OUT=${OUT:-/tmp/gpu_bench}
SHARED_DATA=${SHARED_DATA:-../shared/data/scholarqabench}
mkdir -p "$OUT"
PY=$(command -v python3 || command -v python)

if [[ "${1:-}" == "--prepare" ]]; then
  SP=$("$PY" -c 'import jraph, os; print(os.path.dirname(os.path.dirname(jraph.__file__)))')
  mkdir -p "$CARRY/site" "$CARRY/data" "$CARRY/whl"
  cp -r "$SP/jraph" "$SP/pysbd" "$SP/ml_collections" "$CARRY/site/" || exit 1
  cp "$SHARED_DATA/scifact_test.jsonl" "$SHARED_DATA/pubmed_test.jsonl" "$CARRY/data/" || exit 1
  # sentencex is compiled: fetch the build for the GPU image's CPython 3.12 (see the device notes).
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
    --platform manylinux2014_x86_64 -d "$CARRY/whl" sentencex==1.0.32 || exit 1
  find "$CARRY" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$CARRY"
  exit 0
fi

export PYTHONUNBUFFERED=1
# JAX must not grab 75% of the card: torch runs in the same process and peak memory is reported.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
SITE="$PWD/$CARRY/site"
if [[ "${1:-}" == "--dry-run" ]]; then
  export LOGRERANK_PALLAS_INTERPRET=1 JAX_PLATFORMS=cpu
  ARGS=(--size tiny --dtype bfloat16 --attention-impl pallas_gpu --passages 8 --queries 1
        --reps 5 --time-budget 900)
  LIMIT=${LIMIT:-1200}  # interpret mode and a shared CPU: slower than the GPU run
  [[ -d "$CARRY/data" ]] && ARGS+=(--data "$CARRY/data")  # else the slices in tests/data
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    >"$OUT/nvidia_smi.txt" 2>&1
  if compgen -G "$CARRY/whl/*.whl" >/dev/null; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/gpu_site \
      "$CARRY"/whl/*.whl || exit 1
    SITE="$SITE:/tmp/gpu_site"
  fi
  ARGS=(--size base --dtype bfloat16 --attention-impl auto --passages 50 --queries 3 --reps 5
        --data "$CARRY/data" --time-budget 300)
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
"$PY" -c 'import jax, flax, torch, transformers; print("jax", jax.__version__, jax.devices(), "flax",
flax.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' \
  2>&1 | tee "$OUT/versions.txt"
timeout "${LIMIT:-450}" "$PY" -m logrerank_bench.device_run "${ARGS[@]}" --json "$OUT/gpu.json" \
  2>&1 | tee "$OUT/gpu_log.txt"
echo "exit ${PIPESTATUS[0]}"

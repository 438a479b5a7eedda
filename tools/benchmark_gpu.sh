#!/usr/bin/env bash
# Run the GPU benchmark suites unattended (base size, bf16, 50 passages per query) in ~3 minutes.
#
#   OUT=/tmp/gpu_bench tools/benchmark_gpu.sh            # on the GPU machine
#   OUT=/tmp/gpu_bench tools/benchmark_gpu.sh --dry-run  # CPU rehearsal: tiny size, same code path
#
# Installs nothing. Pure-Python deps the GPU image lacks (jraph, pysbd, ml_collections,
# rank_bm25) and the ScholarQABench SciFact file are read from runs/gpu_carry/ (make it with
# `tools/benchmark_gpu.sh --prepare` where ../shared and the deps exist). Writes $OUT/gpu.json,
# $OUT/gpu_log.txt and $OUT/nvidia_smi.txt; the JSON is rewritten after every suite, so a run
# cut short keeps what it measured.
set -uo pipefail
cd "$(dirname "$0")/.."
CARRY=runs/gpu_carry
OUT=${OUT:-/tmp/gpu_bench}
mkdir -p "$OUT"

if [[ "${1:-}" == "--prepare" ]]; then
  SP=$(python -c 'import jraph, os; print(os.path.dirname(os.path.dirname(jraph.__file__)))')
  mkdir -p "$CARRY/site" "$CARRY/data"
  cp -r "$SP/jraph" "$SP/pysbd" "$SP/ml_collections" "$SP/rank_bm25.py" "$CARRY/site/"
  cp ../shared/data/scholarqabench/scifact_test.jsonl "$CARRY/data/"
  find "$CARRY" -name __pycache__ -prune -exec rm -rf {} +
  du -sh "$CARRY"
  exit 0
fi

export PYTHONPATH="$PWD/$CARRY/site:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export PYTHONUNBUFFERED=1
# JAX must not grab 75% of the card: torch runs in the same process and peak memory is reported.
export XLA_PYTHON_CLIENT_PREALLOCATE=false
PY=$(command -v python3 || command -v python)

if [[ "${1:-}" == "--dry-run" ]]; then
  ARGS=(--size tiny --dtype float32 --passages 8 --queries 2 --reps 1 --recompile-queries 10 --time-budget 150)
else
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv \
    >"$OUT/nvidia_smi.txt" 2>&1
  ARGS=(--size base --dtype bfloat16 --passages 50 --queries 6 --reps 3 --recompile-queries 100 --time-budget 120 --no-fused)
fi
"$PY" -c 'import jax, flax, torch, transformers; print("jax", jax.__version__, jax.devices(), "flax",
flax.__version__, "torch", torch.__version__, "transformers", transformers.__version__)' \
  2>&1 | tee "$OUT/versions.txt"
# Suites in priority order; --time-budget skips the ones not started in time.
timeout "${LIMIT:-210}" "$PY" tools/benchmark.py --suite params,packing,encoder,pipeline,recompile \
  --data "$CARRY/data" "${ARGS[@]}" --json "$OUT/gpu.json" 2>&1 | tee "$OUT/gpu_log.txt"
echo "exit ${PIPESTATUS[0]}"

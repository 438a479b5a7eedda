#!/usr/bin/env bash
# The README's main command. On a fresh machine: installs the package, trains both LoG stages
# (tiny config) on the shipped PubMedQA-derived demo data, reranks the 16 held-out real queries,
# and prints Recall/MAP/nDCG@10 next to BM25. About 1-2 minutes on 2 CPU cores (README).
#   bash tools/demo.sh [RUN_DIR]        (default: runs/demo; an existing run is resumed)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
DEMO=logrerank_jax/demo_data
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -e .
mkdir -p "$RUN"
echo "== 1/4 local stage: encoder + intent/role heads (listwise + role-KL loss)"
python tools/train.py --config configs/local_stage.py:tiny --workdir "$RUN/local"
echo "== 2/4 global stage: sentence graph + relation-aware GAT (pairwise loss), local model frozen"
python tools/train.py --config configs/global_stage.py:tiny \
  --config.local_checkpoint="$RUN/local" --workdir "$RUN/global"
echo "== 3/4 rerank the held-out queries (structured output: $RUN/reranked.jsonl)"
python tools/rerank.py --checkpoint "$RUN/global" --input "$DEMO/test_queries.jsonl" \
  --output "$RUN/reranked.jsonl" --no-progress
echo "== 4/4 evaluate against BM25 (passage ranking, gold context = relevant)"
python tools/evaluate.py --pools "$DEMO/test_queries.jsonl" --qrels "$DEMO/test.qrels" \
  --checkpoint "$RUN/global" --out-dir "$RUN/eval" --no-progress
if python -c "import matplotlib" 2>/dev/null; then
  python tools/plot_training.py --workdir "$RUN/local" --workdir "$RUN/global" --output "$RUN/curves.png"
else
  echo "(training curves: pip install matplotlib, then tools/plot_training.py --workdir $RUN/local --workdir $RUN/global)"
fi

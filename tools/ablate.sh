#!/usr/bin/env bash
# A small reproduction of the paper's ablations (Tables 3 and 12) with the demo's recipe: each
# variant is trained by tools/demo.sh's commands with one `--config.ablation`, evaluated on both
# of the demo's pool sets, and compared, paired per question, with the main job's full LoG.
#   bash tools/ablate.sh [MAIN_RUN] [ABLATION_RUN] [--global-only]   (defaults: runs/demo, runs/ablate)
# --global-only: only the variants that retrain the global stage alone (w/o global and the edges).
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
GLOBAL_ONLY=0
POS=()
for arg in "$@"; do
  case "$arg" in
    --global-only) GLOBAL_ONLY=1 ;;
    -*) echo "tools/ablate.sh: unknown option $arg (usage: bash tools/ablate.sh [MAIN_RUN] [ABLATION_RUN] [--global-only])" >&2; exit 2 ;;
    *) POS+=("$arg") ;;
  esac
done
MAIN=${POS[0]:-runs/demo}
OUT=${POS[1]:-runs/ablate}
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
  # The frozen local model's cached features do not depend on the graph switches: start from the
  # main run's cache (fingerprinted by the local model, packing and files; a mismatch recomputes).
  mkdir -p "$d/global"
  [ -d "$d/global/feature_cache" ] || cp -r "$MAIN/global/feature_cache" "$d/global/"
  python tools/train.py --config configs/global_stage.py:minilm --config.ablation="$ab" \
    --config.local_checkpoint="$MAIN/local" --workdir "$d/global" --config.progress_bar=False
  evaluate "$d" "$d/global" ""
  stamp
done
TWO_STAGE=("w/o role head" "w/o intent head")
[ "$GLOBAL_ONLY" = 1 ] && TWO_STAGE=()
for ab in "${TWO_STAGE[@]}"; do
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

#!/usr/bin/env bash
# Data build -> training -> before/after evaluation, each job starting only
# when the previous one succeeded (--dependency=afterok).
#
#   slurm/pipeline.sh --data "recipe=lmsys_prefix" \
#                     --train "recipe=qwen3_prefix" --train-sbatch "--nodes 2 --gpus-per-node 8" \
#                     --eval "recipe=before_after_smollm2 model=Qwen/Qwen3-8B adapted=outputs/train/qwen3_prefix/adapter" --eval-sbatch "--gpus 1" [--eval-shards 8] [--wait]
#
# (2 x 8 = 16 processes keep the paper's effective batch 16; a world size that cannot is refused, see
# slurm/train.sbatch.)
# --eval-shards N: the evaluation as an array of N shards and a merge job (slurm/eval_sharded.sh).
# Arguments inside the quotes are passed through as key=value overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
data_args="recipe=embedded_prefix" train_args="recipe=smollm2_prefix" eval_args="recipe=before_after_smollm2"
data_sbatch="" train_sbatch="" eval_sbatch="" eval_shards=1 wait=""
usage="see the header of $0"
# Everything is parsed and checked before the first job is submitted: a bad argument found after
# the data and training jobs were queued would leave them running for nothing.
while [ $# -gt 0 ]; do
  case "$1" in
    --wait) ;;
    --*) [ $# -ge 2 ] || { echo "error: $1 needs a value ($usage)" >&2; exit 2; } ;;
  esac
  case "$1" in
    --data) data_args=$2; shift 2 ;;
    --train) train_args=$2; shift 2 ;;
    --eval) eval_args=$2; shift 2 ;;
    --data-sbatch) data_sbatch=$2; shift 2 ;;
    --train-sbatch) train_sbatch=$2; shift 2 ;;
    --eval-sbatch) eval_sbatch=$2; shift 2 ;;
    --eval-shards) eval_shards=$2; shift 2 ;;
    --wait) wait="--wait"; shift ;;
    *) echo "error: unknown option $1 ($usage)" >&2; exit 2 ;;
  esac
done
if ! [[ $eval_shards =~ ^[1-9][0-9]*$ ]]; then
  echo "error: --eval-shards $eval_shards: a count of shards is a whole number >= 1" >&2; exit 2
fi
# Each stage's overrides, validated as its entry point will (slurm/check_args.py: recipes, keys, values).
python slurm/check_args.py data "$data_args" train "$train_args" eval "$eval_args" || exit 2
# And each stage's sbatch options, by Slurm itself (--test-only submits nothing).
for stage in "data:$data_sbatch" "train:$train_sbatch" "eval:$eval_sbatch"; do
  name=${stage%%:*} opts=${stage#*:}
  # shellcheck disable=SC2086  # the option strings are deliberately word-split
  if ! tested=$(sbatch --test-only $opts "slurm/$name.sbatch" 2>&1); then
    echo "error: --$name-sbatch '$opts': $(echo "$tested" | grep -m1 -i error || echo "$tested" | head -1)" >&2; exit 2
  fi
done
mkdir -p logs
# A failed step cancels what depends on it instead of leaving it pending forever.
submit() { sbatch --parsable --kill-on-invalid-dep=yes "$@" | cut -d';' -f1; }
# shellcheck disable=SC2086  # the *_args strings are deliberately word-split into overrides
data_job=$(submit $data_sbatch slurm/data.sbatch $data_args)
train_job=$(submit --dependency=afterok:$data_job $train_sbatch slurm/train.sbatch $train_args)
echo "data $data_job -> train $train_job -> eval (submitting)"
if [ "$eval_shards" != 1 ]; then
  # shellcheck disable=SC2086
  bash slurm/eval_sharded.sh "$eval_shards" --after "$train_job" --sbatch "$eval_sbatch" $wait $eval_args
  exit
fi
eval_job=$(submit $wait --dependency=afterok:$train_job $eval_sbatch slurm/eval.sbatch $eval_args)
echo "eval $eval_job"

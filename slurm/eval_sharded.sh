#!/usr/bin/env bash
# A sharded evaluation on Slurm: an array of SHARDS tasks of slurm/eval.sbatch (task i
# evaluates shard i/SHARDS of every side and benchmark, eval/evaluation/shards.py), then one job,
# started once every task succeeded (afterok), that runs the same command without shard:
# it checks and merges the shards and writes the report an unsharded run writes.
#
#   slurm/eval_sharded.sh 4 --sbatch "--gpus 1" recipe=before_after_smollm2 adapted=outputs/train/RUN/adapter
#   slurm/eval_sharded.sh 8 --sbatch "--gpus 1" eval recipe=suite_smollm2 [--wait]
#
# --sbatch: options of the array tasks (and of the merge job unless --merge-sbatch gives
# its own; the merge computes nothing and loads no model: --merge-sbatch "" asks no GPU, and it
# asks 1 CPU and 4 GB instead of eval.sbatch's 8 CPUs and 64 GB unless its options say otherwise).
# --after JOB: start only once JOB succeeded (the training job of slurm/pipeline.sh); not
# --dependency in --sbatch, which would replace the merge job's dependency on the array.
# --wait: return when the merge job ends; non-zero unless it COMPLETED. Prints "shards ID -> merge ID".
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: $0 SHARDS [--sbatch OPTIONS] [--merge-sbatch OPTIONS] [--after JOB] [--wait] [eval|eval.before_after] key=value ..."
if [ $# -lt 1 ] || ! [[ $1 =~ ^[1-9][0-9]*$ ]]; then echo "$usage" >&2; exit 2; fi
shards=$1; shift
array_opts="" merge_opts="" merge_set="" after="" wait="" args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --sbatch) array_opts=$2; shift 2 ;;
    --merge-sbatch) merge_opts=$2; merge_set=1; shift 2 ;;
    --after) after=":$2"; shift 2 ;;
    --wait) wait="--wait"; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[ -n "$merge_set" ] || merge_opts=$array_opts
mkdir -p logs
# A failed shard cancels the merge instead of leaving it pending forever.
submit() { sbatch --parsable --kill-on-invalid-dep=yes "$@" | cut -d';' -f1; }
# shellcheck disable=SC2086  # the option strings are deliberately word-split
array_job=$(submit --array=0-$((shards - 1)) ${after:+--dependency=afterok$after} $array_opts slurm/eval.sbatch "${args[@]}")
echo "shards $array_job -> merge (submitting)"
# shellcheck disable=SC2086
merge_job=$(submit $wait --dependency=afterok:$array_job$after --cpus-per-task=1 --mem=4G $merge_opts slurm/eval.sbatch "${args[@]}")
echo "shards $array_job -> merge $merge_job"
if [ -n "$wait" ]; then
  # sbatch --wait exits 0 for a job cancelled before it ran (a shard failed: afterok never holds).
  state=$(scontrol show job "$merge_job" 2>/dev/null | grep -o 'JobState=[A-Z_]*' | cut -d= -f2 || true)
  if [ "$state" != COMPLETED ]; then
    echo "eval_sharded.sh: merge job $merge_job ended ${state:-in an unknown state}, not COMPLETED: see the logs of array job $array_job" >&2
    exit 1
  fi
fi

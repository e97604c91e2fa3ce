#!/usr/bin/env bash
# The whole loop on the embedded default, on CPU: build the self-distilled prefix
# dataset with SmolLM2-135M, adapt it with LoRA, evaluate before and after on a
# HumanEval subset (headstart/recipes/before_after/demo_smollm2.yaml, sized to fit about 8
# minutes on an idle 2-core machine), write the report and the offline W&B runs.
# Each stage's wall clock and CPU time (user + sys, its processes together) are printed.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec 3>&1 4>&2  # each stage writes to the terminal; only bash's `time` report is captured
times=()
stage() {
  local name=$1; shift
  echo; echo "=== $name: $*"
  local TIMEFORMAT="%R %U %S" measured
  measured=$( { time "$@" 1>&3 2>&4; } 2>&1 )
  times+=("$(awk -v name="$name" '{printf "%s %.0fs (cpu %.0fs)", name, $1, $2 + $3}' <<<"$measured")")
}
stage data python -m data_builders recipe=embedded_prefix "$@"
# accelerate gives a single process one thread unless told (OMP_NUM_THREADS=1 by default): on
# CPU that trained on one of the two cores.
stage train accelerate launch --num_processes 1 --num_cpu_threads_per_process "${OMP_NUM_THREADS:-$(nproc)}" \
  train/sft.py recipe=smollm2_prefix
stage eval python -m eval.before_after recipe=demo_smollm2
echo; echo "=== time per stage: ${times[*]}"
echo "dataset:  outputs/data/embedded_prefix"
echo "adapter:  outputs/train/smollm2_prefix/adapter   merged: outputs/train/smollm2_prefix/merged"
echo "report:   outputs/before_after/demo/report.md (and report.html, figures/)"
echo "W&B:      offline runs in outputs/train/smollm2_prefix/wandb and outputs/before_after/demo/wandb (wandb sync DIR)"

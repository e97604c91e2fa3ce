#!/usr/bin/env bash
# The whole loop on the embedded default, on CPU: build the self-distilled prefix
# dataset with SmolLM2-135M, adapt it with LoRA, evaluate before and after on a
# HumanEval subset, write the report and the offline W&B runs.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=${WANDB_MODE:-offline} HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
times=()
stage() {
  local name=$1; shift
  echo; echo "=== $name: $*"
  local start=$SECONDS
  "$@"
  times+=("$name $((SECONDS - start))s")
}
stage data python -m data_builders recipe=embedded_prefix "$@"
stage train accelerate launch --num_processes 1 train/sft.py recipe=smollm2_prefix
stage eval python -m eval.before_after recipe=before_after_smollm2
echo; echo "=== time per stage: ${times[*]}"
echo "dataset:  outputs/data/embedded_prefix"
echo "adapter:  outputs/train/smollm2_prefix/adapter   merged: outputs/train/smollm2_prefix/merged"
echo "report:   outputs/before_after/smollm2/report.md (and report.html, figures/)"
echo "W&B:      offline runs in outputs/train/smollm2_prefix/wandb and outputs/before_after/smollm2/wandb (wandb sync DIR)"

#!/usr/bin/env bash
# What only a GPU can show, in one short run on one GPU (about 10 minutes; SmolLM2-135M, offline):
#   1. bf16 + gradient checkpointing: 20 LoRA steps of smollm2_prefix on the embedded data
#   2. ZeRO-3 save and merge: 4 steps under DeepSpeed ZeRO-3 (one process), the adapter gathered
#      from the shards, merged in float32; merged logits against adapter-on logits
#   3. a 5-problem HumanEval streaming evaluation of the bf16 adapter (greedy, lossless)
# and the figures to compare against the README (see "GPU check" there).
#   bash scripts/gpu_check.sh [OUTPUT_DIR]          # default /tmp/headstart-gpu-check (replaced)
#   bash scripts/gpu_check.sh --check               # checks the commands and settings only (no GPU needed)
set -euo pipefail
cd "$(dirname "$0")/.."
check_only=0
if [ "${1:-}" = "--check" ]; then check_only=1; shift; fi
out=${1:-/tmp/headstart-gpu-check}
export HF_HUB_OFFLINE=1 WANDB_MODE=offline TOKENIZERS_PARALLELISM=false
smollm2=$(python -c "from headstart.models import resolve_model_dir; print(resolve_model_dir('smollm2'))")
train=(recipe=smollm2_prefix "data.path=$out/data" "model.name_or_path=$smollm2" training.report_to=[tensorboard])

if [ "$check_only" = 1 ]; then
  # The same recipes, overrides and evaluation settings, parsed and validated; nothing is run.
  python - "${train[@]}" <<'EOF'
import sys
sys.argv[0] = "train/sft.py"
from train.sft import parse_recipe
for extra in (["training.bf16=true", "training.gradient_checkpointing=true", "training.max_steps=20"],
              ["training.max_steps=4", "training.save_steps=4", "training.merge=true"]):
    recipe, name = parse_recipe(sys.argv[1:] + extra)
    print(f"ok: {name} {' '.join(extra)}")
EOF
  python -m eval recipe=humaneval_smollm2 limit=0 output_dir="$out/check-eval"
  [ -f recipes/accelerate/zero3.yaml ] && echo "ok: gpu_check settings"
  exit 0
fi

python -c "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 'no CUDA GPU: this script checks what only a GPU can show')"
rm -rf "$out" && mkdir -p "$out"
python -m data_builders recipe=embedded_prefix output_dir="$out/data" > "$out/data.log" 2>&1

step() { echo "=== $1"; }
step "1. bf16 + gradient checkpointing (20 steps)"
start=$SECONDS
accelerate launch --num_processes 1 train/sft.py "${train[@]}" training.bf16=true \
  training.gradient_checkpointing=true training.max_steps=20 training.merge=false \
  training.output_dir="$out/bf16" > "$out/bf16.log" 2>&1 || { tail -40 "$out/bf16.log"; exit 1; }
grep -E "^processes:|'loss'|^adapter:" "$out/bf16.log"
echo "seconds: $((SECONDS - start))"

step "2. ZeRO-3 save and merge (4 steps, one process)"
accelerate launch --config_file recipes/accelerate/zero3.yaml --num_processes 1 train/sft.py "${train[@]}" \
  training.max_steps=4 training.save_steps=4 training.merge=true training.output_dir="$out/zero3" \
  > "$out/zero3.log" 2>&1 || { tail -40 "$out/zero3.log"; exit 1; }
grep -E "^processes:|^merged:" "$out/zero3.log"
python - "$out" <<'EOF'
import sys, torch
from headstart.models import load_model
out = sys.argv[1]
ids = torch.arange(5, 69).unsqueeze(0).cuda()
def logits(path):
    loaded = load_model(path, device="cuda", dtype=torch.float32)
    with torch.no_grad():
        return loaded.model(ids).logits.float().cpu()
adapter, merged = logits(f"{out}/zero3/adapter"), logits(f"{out}/zero3/merged")
print(f"merged vs adapter-on logits (fp32): max abs diff {(adapter - merged).abs().max().item():.2e} (README: below 1e-5)")
print(f"peak GPU memory: {torch.cuda.max_memory_allocated() / 2**30:.2f} GiB")
EOF

step "3. HumanEval, 5 problems, the bf16 adapter"
python -m eval recipe=humaneval_smollm2 model="$out/bf16/adapter" limit=5 output_dir="$out/eval" \
  > "$out/eval.log" 2>&1 || { tail -40 "$out/eval.log"; exit 1; }
python - "$out/eval/summary.json" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
keys = ["requests", "quality_base", "quality_stream", "identical_to_baseline", "forwards_base_median",
        "forwards_stream_median", "speedup_forwards_median", "speedup_wall_median", "draft_kept_mean"]
for key in keys:
    if key in s:
        print(f"{key}: {s[key]:.3g}" if isinstance(s[key], float) else f"{key}: {s[key]}")
EOF
echo "logs and results: $out"

#!/usr/bin/env bash
# The whole test suite, slow real-model tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec python -m pytest -q --timeout 1800 "$@"

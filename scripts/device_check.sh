#!/usr/bin/env bash
# The device check (scripts/device_check/, run.py): what only a GPU can show, in one short offline run on
# one CUDA GPU (sized for one 10-minute command; never yet run on one), or its CPU twin with --cpu
# (fp32, the identity stage in bf16; what CI runs).
#   bash scripts/device_check.sh [OUTPUT_DIR]                    # default /tmp/headstart-device-check
#   bash scripts/device_check.sh --cpu [OUTPUT_DIR]              # the same stages on CPU
#   bash scripts/device_check.sh --stage zero3 [OUTPUT_DIR]      # one stage again (repeatable)
#   bash scripts/device_check.sh --wheels .whl [OUTPUT_DIR]      # first install the wheels that
#       scripts/device_wheels.sh downloaded (a machine without network); must come first
# OUTPUT_DIR is created and marked (headstart-run.json, kind device-check); a directory without it is
# never emptied, and a non-empty one is refused.
set -euo pipefail
cd "$(dirname "$0")/.."
python=${PYTHON:-python3}
if [ "${1:-}" = "--wheels" ]; then
  [ -n "${2:-}" ] && ls "$2"/*.whl >/dev/null 2>&1 || { echo "error: --wheels needs a folder of wheels (bash scripts/device_wheels.sh)" >&2; exit 2; }
  site=${TMPDIR:-/tmp}/headstart-device-site
  "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$2"/*.whl
  export PYTHONPATH="$site${PYTHONPATH:+:$PYTHONPATH}"
  shift 2
fi
export PYTHONPATH="$PWD/scripts:$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
exec "$python" -m device_check "$@"

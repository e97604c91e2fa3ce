"""Pull the program out of a chat answer."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The fenced block that defines `entry_point` (else the first fenced block,
    else the whole answer). An unterminated fence runs to the end of the answer,
    because a length-capped answer is often cut inside its code block."""
    blocks = [body for language, body in _FENCE.findall(answer) if language.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return answer
    if entry_point:
        for body in blocks:
            if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.MULTILINE):
                return body
    return blocks[0]


def defines(code: str, name: str) -> bool:
    """Whether `code` defines a function `name`."""
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None

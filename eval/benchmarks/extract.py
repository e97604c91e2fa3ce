"""Pull the program out of a chat answer."""

from __future__ import annotations

import re

_FENCE = re.compile(r"```[ \t]*([\w+-]*)[^\n]*\n(.*?)(?:```|\Z)", re.DOTALL)


def extract_code(answer: str, entry_point: str | None = None) -> str:
    """The fenced block that defines `entry_point` (else the first fenced block,
    else the whole answer). An unterminated fence runs to the end of the answer,
    because a length-capped answer is often cut inside its code block.

    Args:
        answer (str): the model's answer.
        entry_point (str | None): the function the program must define; None: take the first block.
    """
    blocks = [body for language, body in _FENCE.findall(answer) if language.lower() in ("", "python", "py", "python3")]
    if not blocks:
        return answer
    if entry_point:
        for body in blocks:
            if re.search(rf"^\s*def\s+{re.escape(entry_point)}\s*\(", body, re.MULTILINE):
                return body
    return blocks[0]


def defines(code: str, name: str) -> bool:
    """Whether `code` defines a function `name`.

    Args:
        code (str): the program's source.
        name (str): the function's name.
    """
    return re.search(rf"^\s*def\s+{re.escape(name)}\s*\(", code, re.MULTILINE) is not None


def ds1000_postprocess(answer: str) -> str:
    """DS-1000's official postprocessing (xlang-ai/DS-1000 `test_ds1000.py`),
    preceded by one step for chat models: a fenced block is taken first, because
    chat answers put prose before their code and the official rule keeps it.

    Args:
        answer (str): the model's answer.
    """
    if "```" in answer:
        answer = extract_code(answer)
    code = answer.split("</code>")[0]
    code = code.replace("```python", "")
    code = code.split("```")[0]
    code = code.split("\nEND SOLUTION")[0]
    return code.replace("<code>", "")


_LEAD_IN = re.compile(r"^[^\n]{0,80}:[ \t]*\n+")


def extract_text(answer: str) -> str:
    """The edited text of a prose answer: without a short lead-in line ending in
    a colon ("Here is the corrected sentence:") and without enclosing quotes.

    Args:
        answer (str): the model's answer.
    """
    text = answer.strip()
    stripped = _LEAD_IN.sub("", text, count=1).strip()
    text = stripped or text
    if len(text) >= 2 and text[0] == text[-1] and text[0] in "\"'":
        text = text[1:-1].strip()
    return text

"""CoEdIT (text edits: grammar, fluency, clarity, coherence, simplification,
paraphrase, neutralisation), scored by normalised token F1 against `tgt`."""

from __future__ import annotations

from typing import Any

from eval.benchmarks.base import Request, Score, streamable
from eval.benchmarks.extract import extract_text
from eval.reporting.metrics import token_f1
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.segment import segment_text

SOURCE = DATA["coedit"]


def split_source(src: str) -> tuple[str, str]:
    """`src` is "instruction: text"; the instruction ends at the first colon.

    Args:
        src (str): CoEdIT's source field.
    """
    instruction, colon, text = src.partition(":")
    if not colon or not text.strip():
        raise ValueError(f"CoEdIT src is not 'instruction: text': {src[:80]!r}")
    return instruction.strip(), text.strip()


def coedit_request_text(src: str) -> str:
    """PROTOCOL.md: the text to edit first, the instruction last.

    Args:
        src (str): CoEdIT's source field, "instruction: text".
    """
    instruction, text = split_source(src)
    return f"{text}\n\n{instruction}."


class CoEdIT:
    """The text by sentence, then the instruction; F1 of the edited text."""

    name = "coedit"

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def load(self, limit: int | None = None) -> list[Request]:
        """CoEdIT's streamable requests, in the file's order.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        rows = read_rows(SOURCE, self.path)
        require_fields(rows, SOURCE.schema, f"CoEdIT {self.path or SOURCE.hub_id}")
        requests = streamable([self._request(row) for row in rows])
        return requests[:limit] if limit is not None else requests

    def _request(self, row: dict[str, Any]) -> Request:
        reference = {"tgt": row["tgt"], "task": row.get("task", "")}
        return Request(f"coedit/{row['_id']}", segment_text(coedit_request_text(row["src"])), reference=reference)

    def score(self, request: Request, answer: str) -> Score:
        """Token F1 of the answer's text against the target.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        f1 = token_f1(extract_text(answer), request.reference["tgt"])
        return Score(value=f1, detail=f"f1={f1:.3f}")

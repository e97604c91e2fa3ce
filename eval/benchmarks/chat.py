"""Multi-turn chat: UltraChat dialogues (ultrachat_200k schema) and MT-Bench
questions. The history is present at every step and only the final user turn
is streamed (PROTOCOL.md); the answer is scored by normalised token F1 against
the reference answer. Agreement with the base model's own answer is a summary
column of every benchmark (`agreement_f1`)."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

from eval.benchmarks.base import Request, Score, streamable
from eval.reporting.metrics import token_f1
from headstart.benchmark_registry import DATA, read_rows, require_fields
from headstart.paths import resolve_path
from headstart.segment import segment_request

ULTRACHAT, MT_BENCH, MT_BENCH_REFERENCE = DATA["ultrachat"], DATA["mt_bench"], DATA["mt_bench_reference"]
# An MT-Bench directory holds the questions and, below it, the reference answers (as in headstart/data/mt_bench).
MT_BENCH_QUESTIONS = Path(MT_BENCH.local).name
MT_BENCH_REFERENCES = str(Path(MT_BENCH_REFERENCE.local).relative_to(Path(MT_BENCH.local).parent))


def dialogue_request(request_id: str, messages: list[dict[str, str]]) -> Request | None:
    """The last user turn that has an answer: streamed, after the turns before it.

    Args:
        request_id (str): the request's id.
        messages (list[dict[str, str]]): the dialogue's turns as {"role", "content"} dicts.
    """
    for index in range(len(messages) - 2, -1, -1):
        if messages[index]["role"] == "user" and messages[index + 1]["role"] == "assistant":
            history = [{"role": m["role"], "content": m["content"]} for m in messages[:index]]
            return Request(request_id, segment_request(messages[index]["content"]), history=history,
                           reference={"answer": messages[index + 1]["content"], "source": "ultrachat"})
    return None


def mt_bench_requests(questions: list[dict[str, Any]], references: list[dict[str, Any]]) -> list[Request]:
    """Each question with a reference answer (the others have nothing to score
    against): its first turn alone, and its second turn after the first turn and
    the reference's first answer.

    Args:
        questions (list[dict[str, Any]]): MT-Bench's questions.
        references (list[dict[str, Any]]): its reference answers.
    """
    answers = {row["question_id"]: row["choices"][0]["turns"] for row in references}
    requests = []
    for question in questions:
        turns, reference = question["turns"], answers.get(question["question_id"])
        if reference is None:
            continue
        meta = {"source": "mt_bench", "category": question.get("category", "")}
        history: list[dict[str, str]] = []
        for number, (turn, answer) in enumerate(zip(turns, reference), 1):
            requests.append(Request(f"mtbench/{question['question_id']}-{number}", segment_request(turn),
                                    history=list(history), reference={"answer": answer, **meta}))
            history += [{"role": "user", "content": turn}, {"role": "assistant", "content": answer}]
    return requests


class Chat:
    """`path`: comma-separated local sources. An MT-Bench directory (or its
    question.jsonl, with reference_answer/gpt-4.jsonl beside it) and UltraChat
    files; without `path`, the hub's ultrachat_200k and FastChat's MT-Bench."""

    name = "chat"

    def __init__(self, path: str | None = None) -> None:
        self.path = path

    def load(self, limit: int | None = None) -> list[Request]:
        """The chat requests of every source, interleaved so that the first ones hold every source.

        Args:
            limit (int | None): the most requests to return (the first ones); None: all.
        """
        sources = self._sources()
        groups = [streamable(self._ultrachat(p)) for p in sources["ultrachat"]]
        groups += [streamable(self._mt_bench(p)) for p in sources["mt_bench"]]
        # Interleaved, so that the first N requests hold every source.
        mixed = [r for batch in itertools.zip_longest(*groups) for r in batch if r is not None]
        return mixed[:limit] if limit is not None else mixed

    def _sources(self) -> dict[str, list[str | None]]:
        if self.path is None:
            return {"ultrachat": [None], "mt_bench": [None]}
        sources: dict[str, list[str | None]] = {"ultrachat": [], "mt_bench": []}
        for piece in (p.strip() for p in self.path.split(",") if p.strip()):
            path = resolve_path(piece)
            if not path.exists():
                raise FileNotFoundError(f"chat data not found: {piece}")
            is_mt_bench = path.name == MT_BENCH_QUESTIONS or (path / MT_BENCH_QUESTIONS).is_file()
            sources["mt_bench" if is_mt_bench else "ultrachat"].append(str(path))
        return sources

    def _ultrachat(self, path: str | None) -> list[Request]:
        rows = read_rows(ULTRACHAT, path)
        require_fields(rows, ULTRACHAT.schema, f"UltraChat {path or ULTRACHAT.hub_id}")
        requests = [dialogue_request(f"ultrachat/{row['prompt_id'][:12]}", row["messages"]) for row in rows]
        return [r for r in requests if r is not None]

    def _mt_bench(self, path: str | None) -> list[Request]:
        if path is None:
            questions, references = read_rows(MT_BENCH, None), read_rows(MT_BENCH_REFERENCE, None)
        else:
            directory = Path(path) if Path(path).is_dir() else Path(path).parent
            questions = read_rows(MT_BENCH, directory / MT_BENCH_QUESTIONS)
            references = read_rows(MT_BENCH_REFERENCE, directory / MT_BENCH_REFERENCES)
        require_fields(questions, MT_BENCH.schema, "MT-Bench questions")
        require_fields(references, MT_BENCH_REFERENCE.schema, "MT-Bench reference answers")
        return mt_bench_requests(questions, references)

    def score(self, request: Request, answer: str) -> Score:
        """Token F1 of the answer against the reference answer.

        Args:
            request (Request): the request, with its reference.
            answer (str): the model's answer to the complete request.
        """
        f1 = token_f1(answer, request.reference["answer"])
        return Score(value=f1, detail=f"f1={f1:.3f}")

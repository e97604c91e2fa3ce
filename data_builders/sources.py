"""Source corpora: each turns one raw row into a `Request` or a drop reason.

A source knows its hub id, its schema and the filters its card asks for
(LMSYS: English, not redacted, not flagged; MBPP: train ids 601-974 only).
Schema problems (missing or non-string fields, empty turns, absurd length)
are reported as reasons, never raised, so one bad row costs one row.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headstart.benchmark_registry import DATA
from headstart.segment import segment_mbpp

MBPP_TRAIN, MAGICODER = DATA["mbpp_train"], DATA["magicoder"]


@dataclass
class Request:
    """A complete request with the corpus's own answer (None when it has none).

    `segments` is set by sources whose benchmark defines its own segmentation
    (MBPP); otherwise `headstart.segment.segment_request` decides.
    """

    source: str
    source_id: str
    request: str
    reference: str | None
    segments: list[str] | None = None


@dataclass
class Limits:
    """Bounds under which a row is "absurd" and skipped."""

    max_request_chars: int
    max_answer_chars: int
    languages: tuple[str, ...]
    mbpp_ids: tuple[range, ...] = (MBPP_TRAIN.ids,)  # the MBPP splits read; never the evaluated test split


Adapter = Callable[[dict[str, Any], int, Limits], "Request | str"]


def _text(row: dict[str, Any], field: str) -> str:
    """The string at `field`, or a drop reason naming the field."""
    if field not in row or row[field] is None:
        return _Reason(f"missing_field:{field}")
    value = row[field]
    if not isinstance(value, str):
        return _Reason(f"non_string_field:{field}")
    if not value.strip():
        return _Reason(f"empty_field:{field}")
    return value


class _Reason(str):
    """A drop reason, distinguishable from field text."""


def _checked(
    source: str, source_id: str, request: str, reference: str | None, limits: Limits, segments: list[str] | None = None
) -> Request | str:
    if len(request) > limits.max_request_chars or (reference and len(reference) > limits.max_answer_chars):
        return "absurd_length"
    if "\x00" in request:
        return "invalid_text"
    return Request(source, source_id, request, reference, segments)


def lmsys(row: dict[str, Any], number: int, limits: Limits) -> Request | str:
    """LMSYS-Chat-1M: the first user turn, answered by the first assistant turn.

    Args:
        row (dict[str, Any]): a row of the source.
        number (int): the row's number in the source, for an id it lacks.
        limits (Limits): the length limits of a request and an answer.
    """
    for field in ("conversation_id", "language"):
        value = _text(row, field)
        if isinstance(value, _Reason):
            return value
    if not isinstance(row.get("redacted"), bool):
        return "missing_field:redacted" if row.get("redacted") is None else "non_bool_field:redacted"
    conversation = row.get("conversation")
    if not isinstance(conversation, list) or len(conversation) < 2:
        return "missing_field:conversation" if conversation is None else "bad_conversation"
    reason = _check_turns(conversation)
    if reason:
        return reason
    if row["language"] not in limits.languages:
        return "language"
    if row["redacted"]:
        return "redacted"
    if _flagged(row.get("openai_moderation")):
        return "flagged"
    first, second = conversation[0], conversation[1]
    if first["role"] != "user" or second["role"] != "assistant":
        return "bad_conversation"
    return _checked("lmsys", row["conversation_id"], first["content"], second["content"], limits)


def _check_turns(conversation: list[Any]) -> str | None:
    for turn in conversation:
        if not isinstance(turn, dict):
            return "bad_conversation"
        if not isinstance(turn.get("role"), str):
            return "non_string_field:conversation.role"
        if not isinstance(turn.get("content"), str):
            return "non_string_field:conversation.content"
        if not turn["content"].strip():
            return "empty_turn"
    return None


def _flagged(moderation: Any) -> bool:
    """Any message flagged by the OpenAI moderation API; a missing list counts as unflagged."""
    if not isinstance(moderation, list):
        return False
    return any(isinstance(m, dict) and m.get("flagged") is True for m in moderation)


def mbpp_request(text: str, tests: list[str]) -> str:
    """The MBPP request: the task description, then the asserts the code must pass.

    Args:
        text (str): the task description.
        tests (list[str]): the asserts.
    """
    return "".join(segment_mbpp(text, tests))


def mbpp(row: dict[str, Any], number: int, limits: Limits) -> Request | str:
    """MBPP (full release): the ids of the selected splits (train 601-974 by default); the reference is the canonical code.

    Args:
        row (dict[str, Any]): a row of the source.
        number (int): the row's number in the source, for an id it lacks.
        limits (Limits): the length limits of a request and an answer.
    """
    task_id = row.get("task_id")
    if not isinstance(task_id, int) or isinstance(task_id, bool):
        return "missing_field:task_id" if task_id is None else "non_int_field:task_id"
    if not any(task_id in ids for ids in limits.mbpp_ids):
        return "mbpp_split_not_read"
    text, code = _text(row, "text"), _text(row, "code")
    for value in (text, code):
        if isinstance(value, _Reason):
            return value
    tests = row.get("test_list")
    if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
        return "missing_field:test_list" if tests is None else "non_string_field:test_list"
    code = code.replace("\r\n", "\n")  # the release stores Windows line endings
    segments = segment_mbpp(text, tests)
    return _checked("mbpp", str(task_id), "".join(segments), code, limits, segments)


def _pair_source(name: str, request_field: str, answer_field: str, id_field: str | None) -> Adapter:
    def adapter(row: dict[str, Any], number: int, limits: Limits) -> Request | str:
        request, answer = _text(row, request_field), _text(row, answer_field)
        for value in (request, answer):
            if isinstance(value, _Reason):
                return value
        source_id = row.get(id_field) if id_field else None
        source_id = str(source_id) if isinstance(source_id, (int, str)) and not isinstance(source_id, bool) else f"row{number}"
        return _checked(name, source_id, request, answer, limits)

    adapter.__doc__ = f"{name}: `{request_field}` answered by `{answer_field}`."
    return adapter


def embedded(row: dict[str, Any], number: int, limits: Limits) -> Request | str:
    """Requests shipped with the project ({id, request, reference?}).

    Args:
        row (dict[str, Any]): a row of the source.
        number (int): the row's number in the source, for an id it lacks.
        limits (Limits): the length limits of a request and an answer.
    """
    request = _text(row, "request")
    if isinstance(request, _Reason):
        return request
    reference = row.get("reference") if isinstance(row.get("reference"), str) else None
    source_id = row.get("id") if isinstance(row.get("id"), str) else f"row{number}"
    return _checked("embedded", source_id, request, reference, limits)


@dataclass(frozen=True)
class SourceInfo:
    adapter: Adapter
    hub_id: str | None
    hub_config: str | None
    split: str


SOURCES: dict[str, SourceInfo] = {
    "lmsys": SourceInfo(lmsys, "lmsys/lmsys-chat-1m", None, "train"),
    # the "full" config holds all 974 tasks in train/test/validation/prompt splits
    "mbpp": SourceInfo(mbpp, MBPP_TRAIN.hub_id, MBPP_TRAIN.hub_config, MBPP_TRAIN.split),
    "magicoder": SourceInfo(
        _pair_source("magicoder", "problem", "solution", "index"), MAGICODER.hub_id, MAGICODER.hub_config, MAGICODER.split
    ),
    "evol_codealpaca": SourceInfo(
        _pair_source("evol_codealpaca", "instruction", "output", None), "theblackcat102/evol-codealpaca-v1", None, "train"
    ),
    "embedded": SourceInfo(embedded, None, None, "train"),
}

"""The one segmentation rule for data-builder requests (prose, maybe with code).

Requests from the code corpora and from chat logs mix prose with fenced code
blocks. Prose goes through `segment_text`; the body of each fenced block goes
through `segment_code`, so a cut never falls inside a code line or a string.
Every piece is cut by `headstart.segment`, so the concatenation of the
segments is byte-identical to the request (PROTOCOL.md).
"""

from __future__ import annotations

import re

from headstart.segment import segment_code, segment_text

# An opening fence line (``` or ~~~, optional info string) up to the closing fence line.
_FENCE = re.compile(r"^(?P<fence>```|~~~)[^\n]*\n.*?^(?P=fence)[ \t]*(?:\n|\Z)", re.MULTILINE | re.DOTALL)


def segment_request(text: str) -> list[str]:
    """Segments of a request: sentences and lines of prose, whole code statements in fences.

    The opening fence line joins the first code segment and the closing fence
    joins the last, since neither is worth a step of its own.
    """
    segments: list[str] = []
    position = 0
    for match in _FENCE.finditer(text):
        segments += segment_text(text[position : match.start()]) if match.start() > position else []
        segments += _segment_fenced(match.group(0))
        position = match.end()
    if position < len(text):
        segments += segment_text(text[position:])
    return _merge_blank(segments)


def _segment_fenced(block: str) -> list[str]:
    opening_end = block.index("\n") + 1
    body_end = block.rstrip("\n").rfind("\n") + 1
    if body_end <= opening_end:
        return [block]  # an empty fenced block
    pieces = segment_code(block[opening_end:body_end]) or [""]
    pieces[0] = block[:opening_end] + pieces[0]
    pieces[-1] = pieces[-1] + block[body_end:]
    return pieces


def _merge_blank(segments: list[str]) -> list[str]:
    """Whitespace-only pieces (between prose and a fence) join their predecessor."""
    merged: list[str] = []
    for piece in segments:
        if merged and not piece.strip():
            merged[-1] += piece
        else:
            merged.append(piece)
    if len(merged) > 1 and not merged[0].strip():
        merged[1] = merged[0] + merged[1]
        merged.pop(0)
    return merged

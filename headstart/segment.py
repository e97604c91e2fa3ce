"""Split a request into the segments a user is assumed to type one at a time.

PROTOCOL.md: segmentation is deterministic, lossless (the segments concatenate
to the original text byte for byte) and shared by evaluation and training, so
this module is the only place that decides where a request may be cut, and the
only place that lays out the code requests benchmarks and data builders share.

Prose is cut after sentence-ending punctuation and at line breaks. Code is cut
only at whole lines, never inside a string literal, except inside docstrings,
whose sentences and `>>>` example blocks are segments of their own.

Every request is in a true-prefix format: each S_i is a byte prefix of S_n (the
segments concatenate losslessly to the request), and no markup that frames the
request is opened in one segment and closed only in a later one. Code is given
bare, or a fence (a ``` block, or DS-1000's `<code>...</code>`) closes within
the segment that opens it. A partial request that ends inside an open fence
makes the model close the user's fence instead of answering. An opening tag
left open by the FINAL segment is allowed (DS-1000 prompts end with
"BEGIN SOLUTION\n<code>\n", the official format): nothing after it is streamed.
"""

from __future__ import annotations

import io
import itertools
import re
import tokenize

# A sentence ends at . ! or ? (optionally closed by a quote or bracket) followed
# by whitespace and an upper-case letter, digit, quote or bracket. Requiring the
# capital keeps "e.g. this" and "3.5" in one piece.
_SENTENCE_END = re.compile(r"""[.!?]["')\]]?(?=[ \t]+["'(\[A-Z0-9])""")
_LINE_SENTENCE_END = re.compile(r"""[.!?:]["')\]]?\s*$""")


def segment_text(text: str) -> list[str]:
    """Cut prose after each sentence and at each line break.

    Whitespace after a sentence starts the next segment, because tokenizers
    attach a leading space to the following word; a newline ends its line.

    Args:
        text (str): the prose to cut.
    """
    cuts: set[int] = set()
    for match in _SENTENCE_END.finditer(text):
        cuts.add(match.end())
    for match in re.finditer(r"\n+(?=[^\n])", text):
        cuts.add(match.end())
    return _cut(text, cuts)


def segment_code(code: str) -> list[str]:
    """Cut Python source at top-level statements and inside docstrings.

    Imports stay with the definition that follows them, decorators with their
    function. Source that does not tokenize is cut at top-level lines only.

    Args:
        code (str): the Python source to cut.
    """
    lines = code.splitlines(keepends=True)
    starts = _line_offsets(lines)
    docstrings = _docstring_line_spans(code)
    cuts: set[int] = set()
    in_doc = {row for first, last in docstrings for row in range(first, last + 1)}
    for first, last in docstrings:
        cuts.add(starts[first])
        if last + 1 < len(lines):
            cuts.add(starts[last + 1])
        cuts |= _docstring_cuts(lines, starts, first, last)
    cuts |= _top_level_cuts(lines, starts, in_doc)
    return _cut(code, cuts)


def _line_offsets(lines: list[str]) -> list[int]:
    offsets, total = [], 0
    for line in lines:
        offsets.append(total)
        total += len(line)
    return offsets


def _docstring_line_spans(code: str) -> list[tuple[int, int]]:
    """0-based (first, last) line of every triple-quoted expression statement."""
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(code).readline))
    except (tokenize.TokenError, IndentationError, SyntaxError):
        return []
    spans = []
    statement_start = {tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.NL}
    previous = tokenize.NEWLINE
    for index, token in enumerate(tokens):
        if token.type in (tokenize.COMMENT,):
            continue
        following = tokens[index + 1].type if index + 1 < len(tokens) else tokenize.ENDMARKER
        is_triple = token.type == tokenize.STRING and token.string.lstrip("rRbBuUfF")[:3] in ('"""', "'''")
        if is_triple and previous in statement_start and following in (tokenize.NEWLINE, tokenize.ENDMARKER):
            spans.append((token.start[0] - 1, token.end[0] - 1))
        if token.type != tokenize.NL:
            previous = token.type
    return spans


def _docstring_cuts(lines: list[str], starts: list[int], first: int, last: int) -> set[int]:
    """Cuts between docstring sentences and before each `>>>` example."""
    cuts: set[int] = set()
    previous_kind = "prose"
    previous_text = ""
    for row in range(first, last + 1):
        stripped = lines[row].strip().strip("\"'").strip()
        if row == first and not stripped:
            kind = "opening"  # a bare opening quote line joins the first sentence
        elif stripped.startswith(">>>"):
            kind = "example"
        elif not stripped:
            kind = "blank"
        elif previous_kind in ("example", "output"):
            kind = "output"
        else:
            kind = "prose"
        closing = row == last and row != first and not stripped
        if row > first and not closing:
            if kind == "example":
                cuts.add(starts[row])
            elif kind == "prose" and (
                previous_kind in ("blank", "output") or _LINE_SENTENCE_END.search(previous_text)
            ):
                cuts.add(starts[row])
        if kind == "prose":
            for match in _SENTENCE_END.finditer(lines[row]):
                cuts.add(starts[row] + match.end())
        previous_kind, previous_text = kind, stripped
    return cuts


def _top_level_cuts(lines: list[str], starts: list[int], in_doc: set[int]) -> set[int]:
    """Cut before a top-level statement that follows a blank line, unless
    everything since the last cut is imports (they belong to what follows)."""
    cuts: set[int] = set()
    since_cut: list[str] = []
    for row, line in enumerate(lines):
        if row in in_doc:
            since_cut = []
            continue
        top_level = line[:1] not in (" ", "\t", "\n", "#", "") and not line.startswith(("```", ")", "]", "}"))
        after_blank = row > 0 and not lines[row - 1].strip()
        only_imports = all(not s.strip() or s.startswith(("import ", "from ")) for s in since_cut)
        if top_level and after_blank and since_cut and not only_imports:
            cuts.add(starts[row])
            since_cut = []
        since_cut.append(line)
    return cuts


def _cut(text: str, cuts: set[int]) -> list[str]:
    """Slice at the cut offsets; whitespace-only pieces join their predecessor."""
    segments: list[str] = []
    previous = 0
    for offset in sorted(c for c in cuts if 0 < c < len(text)) + [len(text)]:
        piece = text[previous:offset]
        previous = offset
        if not piece:
            continue
        if segments and not piece.strip():
            segments[-1] += piece
        else:
            segments.append(piece)
    if len(segments) > 1 and not segments[0].strip():
        segments[1] = segments[0] + segments[1]
        segments.pop(0)
    return segments


def prefixes(segments: list[str]) -> list[str]:
    """S_1..S_n: the request as known after each segment has been typed.

    Args:
        segments (list[str]): the request's segments, in order.
    """
    known, out = "", []
    for segment in segments:
        known += segment
        out.append(known)
    return out


# A ``` block (up to three spaces of indent, as in Markdown) through its closing
# fence; one never closed runs to the end of the text, so that only the final
# segment can leave it open.
_FENCED_BLOCK = re.compile(r"^ {0,3}```[^`\n]*\n.*?(?:^ {0,3}```[ \t]*(?:\n|\Z)|\Z)", re.MULTILINE | re.DOTALL)
# DS-1000's <code>...</code> block; the prompt's final, unclosed <code> runs to the end.
_TAGGED_BLOCK = re.compile(r"<code>.*?(?:</code>\n?|\Z)", re.DOTALL)


def segment_request(text: str) -> list[str]:
    """A free-form request (chat turns, instruction corpora): prose by sentence,
    each fenced block one whole segment, fence lines included.

    Args:
        text (str): the request.
    """
    return _prose_and_blocks(text, _FENCED_BLOCK)


def segment_ds1000(prompt: str) -> list[str]:
    """A DS-1000 prompt: prose by sentence and line, each `<code>` block one whole
    segment, tags included.

    Args:
        prompt (str): the DS-1000 prompt.
    """
    return _prose_and_blocks(prompt, _TAGGED_BLOCK)


def _prose_and_blocks(text: str, block: re.Pattern[str]) -> list[str]:
    # A block is never cut: a cut inside it would leave its fence open in S_i.
    pieces: list[str] = []
    position = 0
    for match in block.finditer(text):
        pieces += segment_text(text[position : match.start()])
        pieces.append(match.group(0))
        position = match.end()
    pieces += segment_text(text[position:])
    return _joined(pieces)


def _joined(pieces: list[str]) -> list[str]:
    """Pieces cut separately, made one segmentation (whitespace-only pieces join a neighbour)."""
    return _cut("".join(pieces), set(itertools.accumulate(len(p) for p in pieces)))


def segment_code_request(instruction: str, code: str) -> list[str]:
    """An instruction, then code to complete given bare (HumanEval): the
    instruction by sentence, the code by `segment_code`.

    Args:
        instruction (str): the prose before the code.
        code (str): the code to complete.
    """
    return _joined(segment_text(instruction) + segment_code(code))


def segment_edit_request(code: str, instruction: str) -> list[str]:
    """An edit request (CanItEdit; PROTOCOL.md: program first, instruction last):
    the program bare, cut by `segment_code`, a blank line, then the instruction
    by sentence.

    Args:
        code (str): the program to edit.
        instruction (str): the edit instruction.
    """
    return _joined(segment_code(code.rstrip() + "\n\n") + segment_text(instruction.strip()))


MBPP_TESTS_INTRO = "Your code should pass these tests:\n"


def segment_mbpp(description: str, tests: list[str]) -> list[str]:
    """An MBPP-style request (train and test splits alike): the description by
    sentence, then one bare assert line per segment, the first led by
    `MBPP_TESTS_INTRO`. `segment_code` would keep adjacent asserts together.

    Args:
        description (str): the task's description.
        tests (list[str]): the assert lines, one per test.
    """
    lines = [test.strip() for test in tests]
    asserts = [line + "\n" for line in lines[:-1]] + lines[-1:]
    asserts[0] = MBPP_TESTS_INTRO + asserts[0]
    return segment_text(description.strip() + "\n") + asserts

"""The completion format: how a base model (one with no chat format) is prompted.

A base model continues text. Its prompt is the request's own text in a frame such text has in
pretraining data (a function's signature and docstring, a module docstring, a transcript), and
its answer is the continuation, ended by stop strings: what would open the next part of such a
document. Each benchmark declares its frame (eval.benchmarks.BENCHMARKS); dialogues get
`TRANSCRIPT`, and training rows the frame their data build names (`FRAMES`; the transcript by
default). The frame wraps each prefix S_i whole, so no markup is left open by a partial request
(PROTOCOL.md).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class CompletionFrame:
    """The text around a request in the completion format, and the strings that end its answer."""

    before: str = ""  # what precedes the request's text
    after: str = ""  # what follows it; the answer begins right after
    drop: str = ""  # a chat instruction the request opens with, left out (a partial one too)
    stop: tuple[str, ...] = ()  # texts that end the answer (cut before them, as vLLM's `stop`)
    answer_lead: str = ""  # what a training row puts between the prompt and its answer (stored answers are stripped)

    def prompt(self, request: str) -> str:
        """The framed text of a request (or of a prefix of it).

        Args:
            request (str): the request's text as known.
        """
        if self.drop and self.drop.startswith(request):
            request = ""  # the user is still typing the instruction: no code yet
        return self.before + request.removeprefix(self.drop) + self.after


# A dialogue as a plain transcript: chat, text edits, and training rows by default.
TRANSCRIPT = CompletionFrame(before="User: ", after="\nAssistant:", stop=("\nUser:",), answer_lead=" ")
# What ends a completed program: a test or use of it, a closing fence.
PROGRAM_STOPS = ("\nif __name__", "\nprint(", "\nassert ", "\n```")
# What ends a completed function's body: the next top-level definition too.
FUNCTION_STOPS = ("\ndef ", "\nclass ", *PROGRAM_STOPS)

# The frames by name: each benchmark declares its own (eval.benchmarks.BENCHMARKS), and a data
# build names the one its rows are written in (`generation.completion_frame`), so that a base
# model is trained on requests framed as the benchmark it is evaluated on frames them.
FRAMES: dict[str, CompletionFrame] = {
    "transcript": TRANSCRIPT,
    # The request is a signature and docstring: the function's body continues it.
    "function": CompletionFrame(stop=FUNCTION_STOPS),
    # The task as a module docstring; the program follows it.
    "docstring": CompletionFrame(before='"""\n', after='\n"""\n', stop=('\n"""', *PROGRAM_STOPS)),
    # The program and the instruction under one heading, the edited program under the next.
    "code_after": CompletionFrame(before="## Code Before:\n", after="\n## Code After:\n", stop=("\n## ",)),
    # A prompt that already ends where the solution code begins (DS-1000's).
    "solution": CompletionFrame(stop=("</code>", "\nEND SOLUTION", "# SOLUTION END")),
}


def completion_frame(name: str) -> CompletionFrame:
    """The frame called `name` in FRAMES; ValueError naming the known ones otherwise.

    Args:
        name (str): a key of FRAMES.
    """
    if name not in FRAMES:
        raise ValueError(f"unknown completion frame {name!r}; known: {', '.join(FRAMES)}")
    return FRAMES[name]


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """`text` cut before its first stop string, and whether one was found.

    Args:
        text (str): an answer's text.
        stop (tuple[str, ...]): the stop strings.
    """
    cuts = [text.find(string) for string in stop if string in text]
    return (text[: min(cuts)], True) if cuts else (text, False)


def render_completion(messages: list[dict[str, str]], frame: CompletionFrame, bos: str | None = None) -> str:
    """The completion-format text of a dialogue: BOS, the system message as a first paragraph,
    earlier turns as a transcript, then the final user turn in `frame`.

    Args:
        messages (list[dict[str, str]]): the dialogue (headstart.prompts.build_messages), ending with the user turn.
        frame (CompletionFrame): the frame of the final user turn.
        bos (str | None): the tokenizer's BOS text (the prompt is encoded without special tokens), or None.
    """
    if not messages or messages[-1]["role"] != "user":
        raise ValueError("a completion-format prompt ends with the user's request")
    parts = [bos or ""]
    for message in messages[:-1]:
        if message["role"] == "system":
            parts.append(f"{message['content']}\n\n")
        else:
            speaker = TRANSCRIPT.before if message["role"] == "user" else "Assistant: "
            parts.append(f"{speaker}{message['content']}\n")
    return "".join(parts) + frame.prompt(messages[-1]["content"])

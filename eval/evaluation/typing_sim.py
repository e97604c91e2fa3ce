"""Typing-time simulation (PROTOCOL.md, "Typing-time simulation (optional)").

A request is typed character by character in simulated time; segment S_i becomes
available when its last character is typed, and the last character is Enter's
moment. Drafting updates run in the gaps; when the next segment arrives before an
update is done, the policy either `finish`es it (the next update then waits) or
`abandon`s it (its work is lost, the held draft stays, and the next update starts
at once from the newest segment). Every update, the abandoned one included, starts
from the newest segment available when it starts.

Where durations come from (the design choice, and why):
- Which draft is held changes with the timing, so each update's forwards are
  re-derived from the tokens: under `greedy` acceptance D_i = greedy(S_i) whatever
  draft was held (the fast path's per-prefix drafts), and the forwards of an update
  holding D_j are `lookup.update_cost`, the count the engine executes (checked
  against the stepwise engine by the AR engine's tests). Other rules make D_i
  depend on the held draft, which would need the model at report time: refused.
- Seconds = each forward's cost x a per-request rate measured on this model and machine
  and already recorded in results.jsonl. A forward's cost is in one-token steps: its
  width's under `decode.width_cost` (a verify pass over a new segment, a proposal, a
  token tree cost several steps on a CPU; eval/engines/width_table.py), one step each
  without a table. Drafting updates run at the baseline's rate (baseline_seconds over
  its steps: a prefill of the prompt, then one-token steps on this request's context);
  the final update is the sentence replay's own residual_seconds, scaled by its cost
  against the replay's final update. So the unlimited typist (every update done before
  the next segment) reproduces the sentence replay exactly (the scale factor is exactly
  1), the baseline is the measured one, and a report rebuilt from results.jsonl is the
  same report (no clock is read here). The cache a verify pass reuses is taken to hold
  the previous update's prompt and answer (an abandoned update's work is not kept).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from eval.engines.decode import AR_ENGINES, DecodeSpec
from eval.engines.lookup import update_widths
from eval.engines.tokens import common_prefix_length, reused_prefix
from headstart.files import read_text

POLICIES = ("finish", "abandon")
# The speeds every typing report plots, beside the unlimited typist: 260 is the measured average
# typist (about 52 words a minute), the headline speed.
AVERAGE_TYPIST_CPM = 260
CURVE_CPM = (200, AVERAGE_TYPIST_CPM, 400, 800)
# Arrival spacing of the unlimited typist: longer than any update (checked), so every
# update finishes first; finite, so times stay ordinary floats.
UNLIMITED_GAP = 1e9


@dataclass(frozen=True)
class Typist:
    """When each character is typed: `gaps[k % len(gaps)]` seconds after the one before
    (the first after time 0); `gaps` None: unlimited time between segments."""

    label: str
    gaps: tuple[float, ...] | None

    def arrivals(self, segments: list[str]) -> list[float]:
        """Seconds at which each S_i is complete (its last character typed).

        Args:
            segments (list[str]): the request's segments S_1..S_n, in order.
        """
        if self.gaps is None:
            return [UNLIMITED_GAP * (i + 1) for i in range(len(segments))]
        times, typed, clock = [], 0, 0.0
        for segment in segments:
            for _ in segment:
                clock += self.gaps[typed % len(self.gaps)]
                typed += 1
            times.append(clock)
        return times


def cpm_typist(cpm: float) -> Typist:
    """A typist of constant speed: one character every 60/`cpm` seconds.

    Args:
        cpm (float): the typing speed in characters per minute.
    """
    if not (cpm > 0 and math.isfinite(cpm)):
        raise ValueError(f"typing=cpm:N needs a typing speed N > 0 characters per minute, not {cpm}")
    return Typist(f"cpm:{cpm:g}", (60.0 / cpm,))


UNLIMITED = Typist("unlimited", None)


def parse_typist(spec: str) -> Typist:
    """`unlimited`, `cpm:<N>`, or the path of a keystroke trace (`read_trace`).

    Args:
        spec (str): the `typing` setting.
    """
    if spec == "unlimited":
        return UNLIMITED
    if spec.startswith("cpm:"):
        try:
            cpm = float(spec[4:])
        except ValueError:
            raise ValueError(f"typing={spec!r}: N of cpm:N must be a number of characters per minute") from None
        return cpm_typist(cpm)
    path = Path(spec)
    if not path.is_file():
        raise ValueError(f"typing={spec!r}: neither 'unlimited', 'cpm:<N>' nor an existing keystroke trace file")
    return read_trace(path)


def read_trace(path: Path) -> Typist:
    """A recorded keystroke trace: one keystroke per line, its time in seconds, optionally
    followed by a tab and the character typed (ignored); blank lines and '#' comments
    skipped. Its gaps are replayed in turn, cyclically, for requests longer than it.

    Args:
        path (Path): the trace file.
    """
    times: list[float] = []
    for number, line in enumerate(read_text(path).splitlines(), 1):
        text = line.split("\t", 1)[0].strip()
        if not text or text.startswith("#"):
            continue
        try:
            time = float(text)
        except ValueError:
            raise ValueError(f"{path}:{number}: {text!r} is not a keystroke time in seconds") from None
        if not math.isfinite(time) or time < 0:
            raise ValueError(f"{path}:{number}: keystroke time {text} must be a finite number of seconds >= 0")
        if times and time < times[-1]:
            raise ValueError(f"{path}:{number}: keystroke times must not decrease ({time:g} after {times[-1]:g})")
        times.append(time)
    if len(times) < 2:
        raise ValueError(f"{path}: a keystroke trace needs at least 2 keystroke times, found {len(times)}")
    gaps = tuple(b - a for a, b in zip(times, times[1:]))
    if not any(gaps):
        raise ValueError(f"{path}: every keystroke has the same time: the trace gives no typing speed")
    return Typist(f"trace:{path.name}", gaps)


@dataclass
class TypedRequest:
    """One request typed by one typist: what the user waits after Enter, and how drafting fared."""

    time_to_answer: float  # seconds from the last keystroke to the complete streamed answer
    baseline_seconds: float  # the baseline starts at Enter
    final_forwards: int
    updates: int  # drafting updates started
    kept_up: int  # of them, done before the next segment arrived
    abandoned: int
    waited: float  # seconds the final update waited for a drafting update (finish policy)
    drafting_forwards: int  # of the finished drafting updates (abandoned work not counted)


def check_typing_decode(decode: DecodeSpec) -> None:
    """The simulation re-derives drafts per prefix: greedy acceptance on an AR engine only.

    Args:
        decode (DecodeSpec): the decode settings.
    """
    if not decode.rule.lossless or decode.engine not in AR_ENGINES:
        raise ValueError("typing simulation needs decode.acceptance=greedy on an autoregressive engine (drafts are "
                         "then per-prefix greedy drafts, whatever draft was held); got "
                         f"acceptance={decode.acceptance}, engine={decode.engine}")


def typing_inputs(record: dict[str, Any]) -> None:
    """Refuse a record that lacks what the simulation needs (written without `typing`).

    Args:
        record (dict[str, Any]): one request's record from results.jsonl.
    """
    missing = [k for k in ("draft_token_ids", "stream_token_ids", "prompt_token_ids", "eos_token_ids") if k not in record]
    if missing:
        raise ValueError(f"record {record.get('request_id')} lacks {', '.join(missing)}: it was evaluated without "
                         "`typing`; evaluate into another output_dir with typing set")


def verify_width(cached: list[int], prompt: list[int], held: list[int]) -> int:
    """Tokens the verify pass feeds (`AREngine.update`): the prompt and held draft past what the
    cache holds, at least the prompt's last token.

    Args:
        cached (list[int]): the tokens the cache holds.
        prompt (list[int]): the update's prompt ids.
        held (list[int]): the held draft's tokens.
    """
    return len(prompt) + len(held) - reused_prefix(cached, prompt, held)


def simulate(record: dict[str, Any], typist: Typist, policy: str, decode: DecodeSpec) -> TypedRequest:
    """Type one recorded request (`typing_inputs`) and replay drafting in simulated time.

    Args:
        record (dict[str, Any]): one request's record from results.jsonl.
        typist (Typist): who types it.
        policy (str): what an update overrun by the next segment does: `finish` or `abandon`.
        decode (DecodeSpec): the decode settings the record was computed with (its width-cost table included).
    """
    typing_inputs(record)
    drafts, prompts = record["draft_token_ids"], record["prompt_token_ids"]
    eos = set(record["eos_token_ids"])
    arrivals = typist.arrivals(record["segments"])
    table = decode.width_table
    steps = table.relative if table else lambda width: 1.0  # a forward's cost in one-token steps

    def update(held: list[int], answer: list[int], earlier: list[list[int]], index: int,
               cached: list[int]) -> tuple[int, float]:
        """Forwards of the update to `answer` (from prompt `index`, holding `held`) and their cost in steps."""
        widths = update_widths(held, answer, common_prefix_length(held, answer), earlier, prompts[index], decode, eos)
        return 1 + len(widths), steps(verify_width(cached, prompts[index], held)) + sum(map(steps, widths))

    baseline_steps = steps(len(prompts[-1])) + record["baseline_forwards"] - 1  # a prefill, then one-token steps
    draft_rate = record["baseline_seconds"] / baseline_steps  # seconds per step on this request's context
    held, earlier, cached, covered, free = [], [], [], 0, 0.0  # covered: segments the held draft answers
    updates = kept = abandoned = spent = 0
    while True:
        start = max(free, arrivals[covered])
        newest = max(i for i, t in enumerate(arrivals) if t <= start)
        if newest == len(arrivals) - 1:
            break
        cost, cost_steps = update(held, drafts[newest], earlier, newest, cached)
        duration = cost_steps * draft_rate
        if typist.gaps is None and duration >= UNLIMITED_GAP:
            raise ValueError(f"an update of {duration:g} s exceeds the unlimited typist's gap")
        updates += 1
        if start + duration <= arrivals[newest + 1]:
            kept += 1
        elif policy == "abandon":
            abandoned += 1
            free = arrivals[newest + 1]
            continue
        earlier = ([held] if held else []) + earlier
        held, covered, free, spent = drafts[newest], newest + 1, start + duration, spent + cost
        cached = prompts[newest] + held[:-1]
    final, final_steps = update(held, record["stream_token_ids"], earlier, len(arrivals) - 1, cached)
    waited = max(0.0, free - arrivals[-1])
    # The sentence replay's final update (held D_{n-1}) took residual_seconds: scaled by its cost, exactly 1.0
    # when the final update is that one.
    replayed = update(drafts[-1], record["stream_token_ids"], drafts[-2::-1], len(arrivals) - 1,
                      prompts[-2] + drafts[-1][:-1])[1]
    seconds = record["residual_seconds"] * (final_steps / replayed)
    return TypedRequest(waited + seconds, record["baseline_seconds"], final, updates, kept, abandoned, waited, spent)


def valid_records(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests every report column uses (metrics.summarize): both answers non-empty.

    Args:
        records (list[dict[str, Any]]): the records from results.jsonl.
    """
    return [r for r in records if r["base_answer"].strip() and r["stream_answer"].strip()]


def typing_point(records: list[dict[str, Any]], typist: Typist, policy: str, decode: DecodeSpec) -> dict[str, Any]:
    """Medians over requests for one typist; per-request rows under 'requests'.

    Args:
        records (list[dict[str, Any]]): the records to simulate (`valid_records`).
        typist (Typist): who types them.
        policy (str): what an update overrun by the next segment does: `finish` or `abandon`.
        decode (DecodeSpec): the decode settings the records were computed with.
    """
    typed = [(r["request_id"], simulate(r, typist, policy, decode)) for r in records]
    updates = sum(t.updates for _, t in typed)
    return {
        "typist": typist.label,
        "time_to_answer_median": statistics.median(t.time_to_answer for _, t in typed),
        "baseline_seconds_median": statistics.median(t.baseline_seconds for _, t in typed),
        "final_forwards_median": statistics.median(t.final_forwards for _, t in typed),
        "kept_up_share": sum(t.kept_up for _, t in typed) / updates if updates else 1.0,
        "requests": [{"request_id": rid} | vars(t) for rid, t in typed],
    }


def break_even_cpm(records: list[dict[str, Any]], policy: str, decode: DecodeSpec, low: float = 50.0,
                   high: float = 51200.0) -> float | None:
    """The slowest typing speed (cpm, within 2%) at which the median streamed time-to-answer
    is no shorter than the median baseline: where the gain disappears. None: a gain
    remains up to `high` cpm; `low`: gone already at `low`.

    Args:
        records (list[dict[str, Any]]): the records to simulate (`valid_records`).
        policy (str): what an update overrun by the next segment does: `finish` or `abandon`.
        decode (DecodeSpec): the decode settings the records were computed with.
        low (float): the slowest speed searched, in characters per minute.
        high (float): the fastest speed searched, in characters per minute.
    """
    def gone(cpm: float) -> bool:
        point = typing_point(records, cpm_typist(cpm), policy, decode)
        return point["time_to_answer_median"] >= point["baseline_seconds_median"]

    if gone(low):
        return low
    if not gone(high):
        return None
    while high / low > 1.02:  # bisection in log space: the simulation is cheap
        middle = math.sqrt(low * high)
        low, high = (low, middle) if gone(middle) else (middle, high)
    return round(high, 1)


def typing_summary(records: list[dict[str, Any]], typist: Typist, policy: str, decode: DecodeSpec) -> dict[str, Any]:
    """The typing report of one benchmark: the configured typist's per-request rows, the
    curve (`CURVE_CPM` and unlimited), and the speed where the gain disappears.

    Args:
        records (list[dict[str, Any]]): the benchmark's records from results.jsonl.
        typist (Typist): the configured typist.
        policy (str): what an update overrun by the next segment does: `finish` or `abandon`.
        decode (DecodeSpec): the decode settings the records were computed with.
    """
    check_typing_decode(decode)
    valid = valid_records(records)
    if not valid:
        return {}
    curve = [typing_point(valid, t, policy, decode) for t in (*map(cpm_typist, CURVE_CPM), UNLIMITED)]
    return {
        "policy": policy,
        "configured": typing_point(valid, typist, policy, decode),
        "curve": [{k: v for k, v in point.items() if k != "requests"} for point in curve],
        "break_even_cpm": break_even_cpm(valid, policy, decode),
    }


def check_typing(spec: str, policy: str, decode: DecodeSpec) -> Typist:
    """Validate the `typing` settings before anything loads; the typist they name.

    Args:
        spec (str): the `typing` setting: `unlimited`, `cpm:<N>` or a keystroke trace file.
        policy (str): the `typing_policy` setting.
        decode (DecodeSpec): the decode settings.
    """
    if policy not in POLICIES:
        raise ValueError(f"typing_policy must be one of {', '.join(POLICIES)}, not {policy!r}")
    check_typing_decode(decode)
    return parse_typist(spec)

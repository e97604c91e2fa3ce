"""The typing-time simulation in a report: its Markdown section, JSON and figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.evaluation.typing_sim import check_typing, typing_summary
from eval.reporting.tables import markdown_rows


def typing_rows(typing: dict[str, dict[str, Any]]) -> tuple[list[str], list[list[str]]]:
    """Per benchmark and typist (the configured one first): median time-to-answer after
    Enter against the baseline, and the share of drafting updates that kept up.

    Args:
        typing (dict[str, dict[str, Any]]): each benchmark's typing summary.
    """
    header = ["benchmark", "typist", "time to answer (med)", "baseline (med)", "gain", "residual fwd (med)", "updates kept up"]
    rows = []
    for benchmark, summary in typing.items():
        points = [summary["configured"]] + [p for p in summary["curve"] if p["typist"] != summary["configured"]["typist"]]
        for point in points:
            stream, base = point["time_to_answer_median"], point["baseline_seconds_median"]
            rows.append([benchmark, point["typist"], f"{stream:.3f} s", f"{base:.3f} s", f"{base / stream:.2f}x",
                         f"{point['final_forwards_median']:g}", f"{point['kept_up_share']:.0%}"])
    return header, rows


def break_even_notes(typing: dict[str, dict[str, Any]]) -> list[str]:
    """Per benchmark, the typing speed at which streaming stops answering sooner.

    Args:
        typing (dict[str, dict[str, Any]]): each benchmark's typing summary.
    """
    notes = []
    for benchmark, summary in typing.items():
        cpm = summary["break_even_cpm"]
        where = "a gain remains at every speed tried" if cpm is None else f"the gain disappears from about {cpm:g} cpm"
        notes.append(f"{benchmark}: {where}")
    return notes


TYPING_TITLE = "Typing-time simulation"
TYPING_NOTE = "Seconds from the last keystroke to the complete answer; the baseline starts decoding at Enter."


def typing_section(typing: dict[str, dict[str, Any]], level: str = "##") -> str:
    """Markdown: `typing_rows` as a table, then `break_even_notes`.

    Args:
        typing (dict[str, dict[str, Any]]): each benchmark's typing summary.
        level (str): the Markdown heading level of the section.
    """
    policy = next(iter(typing.values()))["policy"]
    lines = [f"{level} {TYPING_TITLE} (policy `{policy}`)", "", TYPING_NOTE, "", markdown_rows(*typing_rows(typing)), ""]
    return "\n".join(lines + [f"- {note}." for note in break_even_notes(typing)]) + "\n"


def typing_scalars(summary: dict[str, Any]) -> dict[str, float]:
    """Flat numbers for summary.json and W&B: the configured typist's medians, each curve
    point's median time-to-answer, and the break-even speed (absent: a gain remains).

    Args:
        summary (dict[str, Any]): one benchmark's typing summary.
    """
    configured = summary["configured"]
    scalars = {"typing_time_to_answer_median": configured["time_to_answer_median"],
               "typing_baseline_seconds_median": configured["baseline_seconds_median"],
               "typing_kept_up_share": configured["kept_up_share"]}
    for point in summary["curve"]:
        scalars[f"typing_{point['typist'].replace(':', '')}_time_to_answer_median"] = point["time_to_answer_median"]
    if summary["break_even_cpm"] is not None:
        scalars["typing_break_even_cpm"] = summary["break_even_cpm"]
    return scalars


def write_typing(output_dir: Path, typing: dict[str, dict[str, Any]]) -> str:
    """typing.json (every row, per request) and typing_curve.png; the Markdown section,
    which shows the figure.

    Args:
        output_dir (Path): the run's output directory.
        typing (dict[str, dict[str, Any]]): each benchmark's typing summary.
    """
    from eval.reporting.plots import typing_curve

    (output_dir / "typing.json").write_text(json.dumps(typing, indent=2) + "\n")
    figure = typing_curve(typing, output_dir / "typing_curve.png")
    return typing_section(typing) + f"\n![typing curve]({figure.name})\n"


def typing_report(config, records: list[dict[str, Any]], output_dir: Path, summary: dict[str, Any]) -> str:
    """The typing-time simulation's report section (writes typing.json and its figure, adds
    its numbers to `summary`); '' when off.

    Args:
        config: the evaluation's settings.
        records (list[dict[str, Any]]): the benchmark's per-request records.
        output_dir (Path): the run's output directory.
        summary (dict[str, Any]): the benchmark's summary, which gets the typing numbers.
    """
    if not config.typing:
        return ""
    typist = check_typing(config.typing, config.typing_policy, config.decode)
    timed = [r for r in records if r["residual_seconds"] is not None]  # it runs on measured seconds (count mode times a sample)
    typing = {config.benchmark: typing_summary(timed, typist, config.typing_policy, config.decode)}
    if not typing[config.benchmark]:
        return ""
    section = write_typing(output_dir, typing)
    summary |= typing_scalars(typing[config.benchmark])
    print(f"\n{section}")
    return f"\n{section}"

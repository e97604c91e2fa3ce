"""The typing-time simulation in a report: its Markdown section, JSON and figure."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from eval.reporting.tables import markdown_rows


def typing_section(typing: dict[str, dict[str, Any]]) -> str:
    """Markdown: per benchmark, median time-to-answer after Enter against the baseline for
    each typist, the share of drafting updates that kept up, and the break-even speed."""
    header = ["benchmark", "typist", "time to answer (med)", "baseline (med)", "gain", "residual fwd (med)", "updates kept up"]
    rows = []
    for benchmark, summary in typing.items():
        points = [summary["configured"]] + [p for p in summary["curve"] if p["typist"] != summary["configured"]["typist"]]
        for point in points:
            stream, base = point["time_to_answer_median"], point["baseline_seconds_median"]
            rows.append([benchmark, point["typist"], f"{stream:.3f} s", f"{base:.3f} s", f"{base / stream:.2f}x",
                         f"{point['final_forwards_median']:g}", f"{point['kept_up_share']:.0%}"])
    lines = [f"## Typing-time simulation (policy `{next(iter(typing.values()))['policy']}`)", "",
             "Seconds from the last keystroke to the complete answer; the baseline starts decoding at Enter.", "",
             markdown_rows(header, rows), ""]
    for benchmark, summary in typing.items():
        cpm = summary["break_even_cpm"]
        where = "a gain remains at every speed tried" if cpm is None else f"the gain disappears from about {cpm:g} cpm"
        lines.append(f"- {benchmark}: {where}.")
    return "\n".join(lines) + "\n"


def write_typing(output_dir: Path, typing: dict[str, dict[str, Any]]) -> str:
    """typing.json (every row, per request) and typing_curve.png; the Markdown section,
    which shows the figure."""
    from eval.reporting.plots import typing_curve

    (output_dir / "typing.json").write_text(json.dumps(typing, indent=2) + "\n")
    figure = typing_curve(typing, output_dir / "typing_curve.png")
    return typing_section(typing) + f"\n![typing curve]({figure.name})\n"

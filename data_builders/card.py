"""The dataset card (README.md): what was built, from what, and what was dropped and why."""

from __future__ import annotations

import numpy as np

from data_builders.report import Report, explain

_FORMATS = {
    ("ar", "prefix_to_answer"): "autoregressive prefix-to-answer pairs in TRL conversational format (`messages`: "
    "system = the incomplete-request instruction, user = prefix S_i, assistant = answer to the complete request)",
    ("refusion", "prefix_to_answer"): "ReFusion prefix-to-answer pairs (`query` = prefix S_i, `response` = answer to "
    "the complete request)",
    ("refusion", "draft_refinement"): "ReFusion draft-refinement triples (`query` = S_i, `draft` = the model's answer "
    "to S_{i-1}, empty for i = 1, `response` = answer to the complete request)",
}


def length_stats(values: np.ndarray) -> dict[str, float]:
    """Minimum, mean, median and maximum of lengths (empty for none).

    Args:
        values (np.ndarray): the lengths.
    """
    if len(values) == 0:
        return {}
    return {
        "min": int(values.min()),
        "mean": round(float(values.mean()), 1),
        "median": round(float(np.median(values)), 1),
        "p95": round(float(np.percentile(values, 95)), 1),
        "max": int(values.max()),
    }


def render_card(name: str, fmt: str, pairs: str, answers: str, report: Report, config_yaml: str, command: str,
                model: str | None = None) -> str:
    """The dataset card (README.md) of a build: what it holds, how it was made, and its resolved config.

    Args:
        name (str): the dataset's name.
        fmt (str): the rows' format ("ar" or "refusion").
        pairs (str): the pairs' kind ("prefix_to_answer" or "draft_refinement").
        answers (str): where the answers come from ("self" or the corpus's).
        report (Report): the build's report.
        config_yaml (str): the resolved config, as YAML.
        command (str): the command line that ran the build.
        model (str | None): the model whose greedy answers the rows hold, or None.
    """
    lines = [f"# {name}", "", f"Built by `{command}` (headstart data builders).", ""]
    written = (f" (greedy answers of `{model}`; train that model on them, see `answer_model`)"
               if answers == "self" and model else "")
    lines += [f"Content: {_FORMATS[(fmt, pairs)]}. Answers: `{answers}`{written}.", ""]
    cut = report.drops.get("answer_hit_token_cap", 0)
    if answers == "self":
        lines += [f"Answers that reached the token cap without ending: {cut} requests dropped (`answer_hit_token_cap`).", ""]
    lines += ["Provenance columns: `source`, `source_id`, `prefix_index` (i), `num_segments` (n), `answer_kind`, "
              "`answer_model` (the model that wrote the answer; null for the corpus's own), "
              "`full_request` (S_n, the complete request).", ""]
    lines += _splits(report) + _inputs(report) + _funnel(report) + _drops(report)
    lines += _decontamination(report) + _tokens(report) + _seconds(report)
    lines += ["## Resolved config", "", "```yaml", config_yaml.rstrip(), "```", ""]
    return "\n".join(lines)


def _splits(report: Report) -> list[str]:
    out = ["## Splits", "", "| split | requests | rows |", "|---|---:|---:|"]
    out += [f"| {s} | {v['requests']} | {v['rows']} |" for s, v in report.splits.items()]
    return out + [""]


def _inputs(report: Report) -> list[str]:
    out = ["## Inputs", "", "| source | location | rows read | fingerprint |", "|---|---|---:|---|"]
    for item in report.inputs:
        fingerprint = f"sha256 `{item['sha256']}`" if "sha256" in item else item.get("hub", "")
        out.append(f"| {item['source']} | `{item['location']}` | {report.rows_read.get(item['source'], 0)} | {fingerprint} |")
    return out + [""]


def _funnel(report: Report) -> list[str]:
    out = ["## Counts at every filter", "", "Rows read per source, then requests left after each step.", ""]
    out += ["| step | remaining |", "|---|---:|"]
    for source, read in report.rows_read.items():
        dropped = sum(report.read_drops.get(source, {}).values())
        out.append(f"| {source}: rows read | {read} |")
        out.append(f"| {source}: valid and eligible rows | {read - dropped} |")
    out += [f"| {label} | {count} |" for label, count in report.funnel]
    return out + [""]


def _drops(report: Report) -> list[str]:
    out = ["## Dropped, and why", "", "| stage | reason | count | why | first rows (line numbers in a .jsonl) |",
           "|---|---|---:|---|---|"]
    for source, reasons in report.read_drops.items():
        rows = report.read_drop_rows.get(source, {})
        out += [f"| read {source} | `{r}` | {c} | {explain(r)} | {', '.join(map(str, rows.get(r, [])))} |"
                for r, c in reasons.items()]
    out += [f"| build | `{r}` | {c} | {explain(r)} | |" for r, c in report.drops.items()]
    if len(out) == 4:
        out.append("| - | nothing dropped | 0 | | |")
    return out + [""]


def _decontamination(report: Report) -> list[str]:
    info = report.decontamination
    out = ["## Decontamination", ""]
    out.append(f"Exact match of the normalised request and word {info.get('ngram')}-gram overlap of request or answer.")
    out += ["", "| benchmark | texts indexed |", "|---|---:|"]
    out += [f"| {name} | {count} |" for name, count in info.get("texts", {}).items()]
    if info.get("skipped"):
        out += ["", f"Skipped (files absent, `on_missing: skip`): {', '.join(info['skipped'])}."]
    return out + [""]


def _tokens(report: Report) -> list[str]:
    if not report.tokens:
        return ["## Token lengths", "", "Not computed (no tokenizer configured).", ""]
    out = ["## Token lengths", "", f"Tokenizer: `{report.tokens['tokenizer']}`.", ""]
    out += ["| split | column | min | mean | median | p95 | max |", "|---|---|---:|---:|---:|---:|---:|"]
    for split, columns in report.tokens["splits"].items():
        for column, s in columns.items():
            if s:
                out.append(f"| {split} | {column} | {s['min']} | {s['mean']} | {s['median']} | {s['p95']} | {s['max']} |")
    return out + [""]


def _seconds(report: Report) -> list[str]:
    if not report.seconds:
        return []
    names = {"answers": "answers and drafts (model generation, cached)", "build": "whole build (until the output is written)"}
    out = ["## Build time", "", "Wall clock on the building machine, summed over the runs of a resumed build.", "",
           "| pass | seconds |", "|---|---:|"]
    return out + [f"| {names.get(k, k)} | {v:.1f} |" for k, v in report.seconds.items()] + [""]

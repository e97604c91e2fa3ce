"""Write a build's output directory atomically: dataset, config, report, card, preview."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from datasets import Dataset, DatasetDict
from omegaconf import OmegaConf

from data_builders.card import render_card
from data_builders.config import BuildConfig
from data_builders.report import Report


def save(splits: DatasetDict, config: BuildConfig, report: Report, output: Path, command: str) -> None:
    """Write everything to OUTPUT.partial, then swap it in: a killed build never leaves
    a half-written dataset where the trainer looks."""
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    splits.save_to_disk(str(partial))
    config_yaml = OmegaConf.to_yaml(OmegaConf.structured(config))
    (partial / "config.yaml").write_text(config_yaml)
    (partial / "report.json").write_text(report.to_json() + "\n")
    (partial / "README.md").write_text(
        render_card(config.name, config.format, config.pairs, config.answers, report, config_yaml, command)
    )
    _write_preview(splits["train"], partial / "preview.jsonl", config.preview_rows)
    if output.exists():
        stale = output.with_name(output.name + ".old")
        shutil.rmtree(stale, ignore_errors=True)
        os.replace(output, stale)
        shutil.rmtree(stale)
    os.replace(partial, output)


def _write_preview(dataset: Dataset, path: Path, rows: int) -> None:
    with path.open("w", encoding="utf-8") as handle:
        for row in dataset.select(range(min(rows, len(dataset)))):
            handle.write(json.dumps(row, ensure_ascii=False) + "\n")

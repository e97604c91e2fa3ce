"""The width-cost table (eval/engines/width_table.py): interpolation, files and their errors,
a measurement on a real (tiny) model, and `auto`, measured once per machine and model."""

from __future__ import annotations

import json

import pytest

from eval.__main__ import main as eval_main
from eval.engines.decode import DecodeSpec
from eval.engines.width_measure import measure, resolve
from eval.engines.width_table import WidthCost, auto_path
from eval.width_cost import main as width_cost_main
from headstart.models import load_model

TABLE = WidthCost((1, 2, 5), (0.1, 0.2, 0.5), 256, "m", "cpu-test")


def test_costs_are_linear_between_widths_and_beyond_the_widest():
    assert TABLE.seconds_for(1) == 0.1 and TABLE.seconds_for(5) == 0.5
    assert TABLE.seconds_for(3) == pytest.approx(0.3)
    assert TABLE.seconds_for(9) == pytest.approx(0.9)  # the last segment, extended
    assert TABLE.relative(4) == pytest.approx(4.0)
    flat_top = WidthCost((1, 2, 5), (0.1, 0.3, 0.2), 256, "m", "cpu-test")
    assert flat_top.seconds_for(50) == 0.2  # never below the widest measured
    with pytest.raises(ValueError, match="at least one token"):
        TABLE.seconds_for(0)


@pytest.mark.parametrize(("widths", "seconds", "message"), [
    ((2, 4), (0.1, 0.2), "starting at 1"),
    ((1, 4, 2), (0.1, 0.2, 0.3), "ascending"),
    ((1, 2), (0.1,), "one positive number"),
    ((1, 2), (0.1, 0.0), "one positive number"),
])
def test_a_malformed_table_is_refused(widths, seconds, message):
    with pytest.raises(ValueError, match=message):
        WidthCost(widths, seconds, 256, "m", "cpu-test")


def test_a_table_file_round_trips_and_bad_files_are_named(tmp_path):
    path = tmp_path / "table.json"
    TABLE.save(path)
    assert WidthCost.load(path) == TABLE
    assert DecodeSpec(width_cost=str(path)).width_table == TABLE
    (tmp_path / "bad.json").write_text("{not json")
    (tmp_path / "partial.json").write_text(json.dumps({"widths": [1]}))
    for name, message in [("missing.json", "no such file"), ("bad.json", "not a readable width-cost table"),
                          ("partial.json", "needs the fields")]:
        with pytest.raises(ValueError, match=message):
            DecodeSpec(width_cost=str(tmp_path / name))


def test_measured_costs_are_positive_and_auto_measures_once(tiny_qwen3_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # outputs/ goes here
    model = load_model(str(tiny_qwen3_dir), device="cpu").model
    table = measure(model, "tiny", widths=(1, 4, 16), context=32, repeats=2)
    assert table.widths == (1, 4, 16) and all(s > 0 for s in table.seconds) and table.context == 32
    with pytest.raises(ValueError, match="no table for tiny on this machine yet"):
        resolve("auto", "tiny", "cpu")  # no model to measure on
    first = resolve("auto", "tiny", "cpu", model)
    path = auto_path("tiny", "cpu")
    assert path.is_file() and path.parts[0] == "outputs"
    assert resolve("auto", "tiny", "cpu", model) == first == WidthCost.load(path)  # read, not measured again
    with pytest.raises(ValueError, match="has not been yet"):
        _ = DecodeSpec(width_cost="auto").width_table


def test_the_command_writes_the_table_auto_reads(tiny_qwen3_dir, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert width_cost_main([f"model={tiny_qwen3_dir}", "device=cpu", "repeats=1"]) == 0
    assert "| tokens fed | seconds | one-token steps |" in capsys.readouterr().out
    assert WidthCost.load(auto_path(str(tiny_qwen3_dir), "cpu")).model == str(tiny_qwen3_dir)
    assert width_cost_main(["repeats=0"]) == 2 and "repeats must be >= 1" in capsys.readouterr().err


def test_an_evaluation_with_auto_records_this_machines_table(tiny_qwen3_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "run"
    args = [f"model={tiny_qwen3_dir}", "limit=2", "decode.max_new_tokens=12", "decode.lookup_match=longest",
            "decode.lookup_tree=2", "decode.lookup_choice=cost", "decode.width_cost=auto", f"output_dir={out}"]
    assert eval_main(args) == 0
    settings = json.loads((out / "config.json").read_text())
    assert settings["lookup_choice"] == "cost"
    assert settings["width_cost"] == str(auto_path(str(tiny_qwen3_dir), "cpu")) and (tmp_path / settings["width_cost"]).is_file()
    assert eval_main(args) == 0  # resumed: the same table

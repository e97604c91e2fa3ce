"""The adaptation study's settings (benchmarks/study_adaptation.py): checkpoint spacing and refusals."""

from __future__ import annotations

import pytest
from study_adaptation import StudyConfig

from headstart.config import load_config


def test_a_final_run_checkpoints_often_and_on_every_curve_point():
    """400 steps in 4 curve points (every 100) checkpoint every 20; sdft's 100 in 4 (every 25)
    every 5, the largest spacing within 20 that lands on each curve point."""
    config = load_config(StudyConfig, ["recipe=study_smollm2"])
    assert (config.max_steps, config.curve_points, config.checkpoint_steps) == (400, 4, 20)
    assert config.save_steps("sft") == 20 and config.save_steps("sdft") == 5
    for objective in config.objectives:
        spacing = config.steps(objective) // config.curve_points
        assert spacing % config.save_steps(objective) == 0 and config.save_steps(objective) <= config.checkpoint_steps


@pytest.mark.parametrize(("bad", "message"), [(["checkpoint_steps=0"], "checkpoint_steps >= 1"),
                                              (["curve_points=3"], "multiple of curve_points=3"),
                                              (["objective_steps={refusion: 5}"], "not objectives of the study")])
def test_bad_study_settings_are_refused_before_any_work(bad, message):
    with pytest.raises(ValueError, match=message):
        load_config(StudyConfig, ["recipe=study_smollm2", *bad])

"""The split of a learner step's wall time (dataplane/timing.py): the parts add up to the wall; and the job's one
T_train, the median of the last steps' train times."""

from __future__ import annotations

import pytest

from dataplane.timing import T_TRAIN_STEPS, split_line, step_split, t_train


def test_the_parts_and_other_add_up_to_the_wall() -> None:
    split = step_split(2.0, wait=0.2, train=1.5, checkpoint=0.1, publish=0.05, report=0.05)
    assert split["other"] == pytest.approx(0.1)
    assert sum(split[k] for k in ("wait", "train", "checkpoint", "publish", "report", "other")) == pytest.approx(2.0)
    assert split["train_share"] == pytest.approx(0.75)
    line = split_line(step_split(2.0, wait=0.2, train=1.5, checkpoint=0.12, publish=0.06, report=0.02))
    assert line == "train 75% · wait 10% · checkpoint 6% · other 5% · publish 3% · report 1%"


def test_a_wall_shorter_than_its_parts_is_rounding_not_a_negative_rest() -> None:
    split = step_split(1.0, train=0.8, wait=0.3)
    assert split["other"] == 0.0 and split["wall"] == pytest.approx(1.1)


def test_an_unknown_part_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown parts"):
        step_split(1.0, training=0.5)


def test_t_train_is_the_median_of_the_last_steps_so_a_slow_first_step_does_not_set_it() -> None:
    assert t_train([]) is None
    assert t_train([2.0]) == 2.0
    assert t_train([17.0, 0.05, 0.06]) == pytest.approx(0.06)  # a warm-up step moves it by one rank, not its size
    # only the last T_TRAIN_STEPS count: a change of speed shows within half the window
    slow_then_fast = [1.0] * 20 + [0.1] * (T_TRAIN_STEPS // 2 + 1)
    assert t_train(slow_then_fast) == pytest.approx(0.1)

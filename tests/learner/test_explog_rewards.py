"""The experiment logs (TensorBoard, W&B: learner/explog.py ``scalars``) take each learner-scored reward function's
mean, the reward errors and the completion lengths of a step report, under TRL's names."""

from __future__ import annotations

from learner.explog import scalars


def test_a_step_reports_reward_functions_and_completion_lengths_as_trl_logs_them() -> None:
    report = {"step": 3, "reward_mean": 0.55, "reward_std": 0.4,
              "extra": {"rewards": {"mypkg.rewards:correct": 0.5, "trl.rewards:think_format_reward": 0.25},
                        "reward_errors": 2, "completion_length": {"mean": 7.5, "max": 16.0, "clipped_ratio": 0.25}}}

    out = scalars(report)

    assert out["rewards/mypkg.rewards.correct/mean"] == 0.5
    assert out["rewards/trl.rewards.think_format_reward/mean"] == 0.25
    assert out["rewards/errors"] == 2.0
    assert (out["completions/mean_length"], out["completions/max_length"], out["completions/clipped_ratio"]) == \
        (7.5, 16.0, 0.25)
    assert out["reward/mean"] == 0.55

"""Record limits: what a job's model and task allow a record to hold beyond the schema (dataplane/records.py)."""

from __future__ import annotations

import pytest

from dataplane.records import MAX_REWARD, RecordError, RecordLimits, Trajectory, group_problem, record_problem
from dataplane.tasks import available_tasks, build_task
from tests.groups import group_of


def rec(**overrides) -> dict:
    return {"job_id": 1, "lease_id": "1-0", "group_id": "g", "prompt": "1+2=", "prompt_ids": [1, 5, 6],
            "completion": "3", "completion_ids": [7, 2], "logprobs": [-0.5, -0.1], "reward": 1.0, "version": 0,
            **overrides}


LIMITS = RecordLimits(vocab_size=10, max_completion_tokens=4, reward_range=(0.0, 1.0))


@pytest.mark.parametrize(("bad", "reason"), [
    ({"completion_ids": [10**15, 2]}, "completion_ids: token id 1000000000000000 is not in the model's vocabulary "
                                      "of 10"),
    ({"prompt_ids": [1, 10]}, "prompt_ids: token id 10 is not in the model's vocabulary of 10"),
    ({"completion_ids": [1] * 5, "logprobs": [-1.0] * 5}, "completion_ids: 5 tokens, the job allows at most 4"),
    ({"prompt_ids": [1] * 21}, "prompt_ids: 21 tokens for a prompt of 4 bytes (at most 20)"),
    ({"reward": 1e308}, "reward: 1e+308 is outside the task's range [0, 1]"),
    ({"reward": 1.5}, "reward: 1.5 is outside the task's range [0, 1]"),
    ({"logprobs": [-1e300, -0.1]}, "logprobs: must be finite and within [-10000, 0]"),
])
def test_a_record_outside_the_limits_names_its_field(bad, reason):
    record = Trajectory.model_validate(rec(**bad))
    assert record_problem(record, LIMITS) == reason
    shared = {k: v for k, v in bad.items() if k.startswith("prompt")}  # a group shares its prompt
    group = group_of([rec(**shared), rec(**bad)])
    first_bad = 0 if shared else 1
    assert group_problem(group, LIMITS) == f"records.{first_bad}.{reason}"
    with pytest.raises(RecordError, match=f"^records.{first_bad}."):
        group.check_for_job(job_id=1, group_size=2, max_version=0, limits=LIMITS)


def test_a_record_within_the_limits_passes_and_an_unknown_vocabulary_is_not_checked():
    assert record_problem(Trajectory.model_validate(rec()), LIMITS) == ""
    assert record_problem(Trajectory.model_validate(rec(completion_ids=[10**15, 2])), RecordLimits()) == ""
    # Without limits only the float32-safe bounds hold.
    assert "outside" in record_problem(Trajectory.model_validate(rec(reward=1e308)), RecordLimits())
    group_of([rec(), rec()]).check_for_job(job_id=1, group_size=2, max_version=0)


def test_every_builtin_task_declares_its_reward_range_and_completion_budget():
    spec_dependent = {"sandbox", "dataset", "verifiers"}  # a range from the spec: a game, reward weights, a rubric
    for name in available_tasks():
        assert "reward_range" in vars(available_tasks()[name]) or name in spec_dependent, name
    arithmetic = build_task({"name": "arithmetic"}).record_limits(max_new_tokens=8, vocab_size=100)
    assert arithmetic == RecordLimits(vocab_size=100, max_completion_tokens=8, reward_range=(0.0, 1.0))
    sandbox = build_task({"name": "sandbox", "env": "nim", "max_turns": 3})
    limits = sandbox.record_limits(max_new_tokens=8, vocab_size=None)
    assert limits.reward_range == (0.0, 1.0) and limits.max_completion_tokens > 3 * 8  # turns and replies
    assert -MAX_REWARD <= limits.reward_range[0] <= limits.reward_range[1] <= MAX_REWARD

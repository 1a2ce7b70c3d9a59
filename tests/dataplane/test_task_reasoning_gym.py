"""The reasoning_gym task: prompts from a seeded reasoning-gym dataset, scored by the dataset's own checker."""

from __future__ import annotations

import random

import pytest

from dataplane.tasks import TaskSpecError, build_task

pytest.importorskip("reasoning_gym")

SUMS = {"name": "reasoning_gym", "dataset": "chain_sum", "size": 40, "seed": 3, "answer_format": "plain",
        "config": {"min_terms": 2, "max_terms": 2, "min_digits": 1, "max_digits": 1}}


def test_a_worker_and_the_learner_build_the_same_prompts_and_score_alike() -> None:
    learner, worker = build_task(SUMS), build_task(dict(build_task(SUMS).spec()))
    prompts = [p.text for p in learner.sample_prompts(random.Random(7), 20)]

    assert prompts == [p.text for p in worker.sample_prompts(random.Random(7), 20)]
    assert learner.alphabet == worker.alphabet and set("".join(prompts)) <= set(learner.alphabet)
    answer = worker.entry(prompts[0])["answer"]
    assert prompts[0].endswith("\nAnswer:") and set(answer) <= set(learner.alphabet)
    assert learner.reward(prompts[0], f" {answer}\n") == worker.reward(prompts[0], answer) == 1.0
    assert worker.reward(prompts[0], "nonsense") == 0.0
    assert worker.reward("a prompt it never made", answer) == 0.0
    assert worker.spec() == {**SUMS}


def test_answers_in_tags_are_scored_by_the_datasets_own_checker() -> None:
    task = build_task({"name": "reasoning_gym", "dataset": "basic_arithmetic", "size": 10})
    prompt = task.sample_prompts(random.Random(0), 1)[0].text
    answer = task.entry(prompt)["answer"]

    assert "<answer>answer</answer>" in prompt and task.reward_range == (0.0, 1.0)
    assert task.reward(prompt, f"thinking... <answer>{answer}</answer>") == 1.0
    assert task.reward(prompt, answer) == 0.0  # the prompt asked for tags
    assert 0.0 < task.reward(prompt, f"<answer>{answer}0</answer>") < 1.0  # reasoning-gym's partial credit


@pytest.mark.parametrize(("options", "field"), [
    ({}, "dataset"), ({"dataset": "no_such_set"}, "dataset"), ({"dataset": "chain_sum", "size": 0}, "size"),
    ({"dataset": "chain_sum", "config": {"colour": 1}}, "config"),
    ({"dataset": "chain_sum", "config": {"min_terms": 5, "max_terms": 2}}, "config"),
    ({"dataset": "chain_sum", "config": {"seed": 1}}, "config"), ({"dataset": "chain_sum", "config": [1]}, "config"),
    ({"dataset": "chain_sum", "answer_format": "xml"}, "answer_format"),
])
def test_a_bad_spec_names_the_field(options, field) -> None:
    with pytest.raises(TaskSpecError, match=f"^{field}: "):
        build_task({"name": "reasoning_gym", **options})

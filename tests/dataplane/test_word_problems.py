"""The ``word_problems`` task (dataplane/tasks/word_problems.py): an honest train/held-out split, the same problems on
every machine, the final number scored by math-verify, bad options named."""

from __future__ import annotations

import random
import re

import pytest

from dataplane.jobs import JobSpecError, parse_job_spec
from dataplane.tasks import TaskSpecError, build_task
from dataplane.tasks.word_problems import NAMES, THINGS, final_number

NUMBERS = re.compile(r"\d+")


def skeleton(problem: str) -> tuple[str, tuple[str, ...]]:
    """A problem without its names and objects: its wording with numbers blanked, and its numbers."""
    for word in (*NAMES, *THINGS):
        problem = re.sub(rf"\b{word}\b", "_", problem)
    return NUMBERS.sub("N", problem), tuple(NUMBERS.findall(problem))


def test_no_held_out_problem_is_trained_on() -> None:
    train = build_task({"name": "word_problems", "split": "train", "seed": 3, "size": 1000, "test_size": 100})
    test = build_task({"name": "word_problems", "split": "test", "seed": 3, "size": 1000, "test_size": 100})
    assert len(test.prompts) == 100 and len(train.prompts) == 900
    assert not set(train.prompts) & set(test.prompts)
    # nor a held-out problem with its names changed: no training problem has a held-out one's numbers in its words
    assert len({skeleton(p) for p in test.prompts}) == 100
    assert not {skeleton(p) for p in train.prompts} & {skeleton(p) for p in test.prompts}
    drawn = {p.text for p in train.sample_prompts(random.Random(0), 5000)}
    assert drawn <= set(train.prompts) and not drawn & set(test.prompts)
    # a held-out prompt sent as training work scores 0 there, and its answer scores 1 in the held-out split
    prompt = test.prompts[0]
    assert train.reward(prompt, f"#### {test.answer(prompt)}") == 0.0
    assert test.reward(prompt, f"#### {test.answer(prompt)}") == 1.0


def test_every_machine_builds_the_same_problems_and_another_seed_others() -> None:
    a = build_task({"name": "word_problems", "split": "test"})
    b = build_task(a.spec())
    assert a.prompts == b.prompts and a.answers == b.answers
    assert set(build_task({"name": "word_problems", "split": "test", "seed": 1}).prompts) != set(a.prompts)
    for prompt in a.prompts:  # whole numbers, none negative
        assert int(a.answer(prompt)) >= 0


@pytest.mark.parametrize(("completion", "reward"), [
    ("3 + 4 = 7\n#### 7", 1.0),
    ("#### 7.0", 1.0),  # math-verify compares the numbers
    ("#### 1,007", 0.0),
    ("She has 3 and gets 4, so 7 in all.", 1.0),  # no #### line: the last number
    ("#### 7\nor maybe 8", 1.0),  # the #### line wins over a later number
    ("#### 7\n#### 7\n#### 1", 1.0),  # the first #### line: one repeated until the tokens ran out
    ("#### 8\n#### 7", 0.0),
    ("7 is wrong, the answer is #### 8", 0.0),
    ("I do not know", 0.0),
    ("", 0.0),
])
def test_the_final_number_is_scored(completion: str, reward: float) -> None:
    task = build_task({"name": "word_problems", "split": "test"})
    prompt = next(p for p in task.prompts if task.answer(p) == "7")
    assert task.reward(prompt, completion) == reward


def test_require_hashes_scores_only_a_hashes_line() -> None:
    task = build_task({"name": "word_problems", "split": "test", "require_hashes": True})
    prompt = task.prompts[0]
    answer = task.answer(prompt)
    assert task.reward(prompt, f"so {answer}") == 0.0
    assert task.reward(prompt, f"so\n#### {answer}") == 1.0
    assert final_number("a 1,234 b") == "1234" and final_number("none") is None


def test_the_template_wraps_each_problem() -> None:
    task = build_task({"name": "word_problems", "template": "Question: {problem}\nAnswer:"})
    assert all(p.startswith("Question: ") and p.endswith("\nAnswer:") for p in task.prompts)


@pytest.mark.parametrize(("options", "message"), [
    ({"split": "valid"}, "split: must be one of train, test"),
    ({"size": 5}, "size: must be an integer between 10 and 10000"),
    ({"test_size": 600, "size": 1000}, "test_size: must be an integer between 1 and size/2 (500)"),
    ({"seed": -1}, "seed: must be an integer"),
    ({"template": "no placeholder"}, "template: must be a string"),
    ({"require_hashes": "yes"}, "require_hashes: must be true or false"),
    ({"splt": "test"}, "unknown option 'splt' (did you mean 'split'?)"),
])
def test_bad_options_are_named(options: dict, message: str) -> None:
    with pytest.raises(TaskSpecError, match=re.escape(message)):
        build_task({"name": "word_problems", **options})


def test_a_job_evaluates_on_the_held_out_split_and_bad_eval_settings_are_named() -> None:
    base = {"name": "wp", "model_dir": "/models/m", "task": {"name": "word_problems"}}
    spec = parse_job_spec({**base, "eval": {"before": True, "after": True, "split": "test", "problems": 30}})
    assert spec.eval.enabled and spec.eval.build_task(spec.task).spec()["split"] == "test"
    assert not parse_job_spec(base).eval.enabled  # off unless asked
    cases = [
        ({"after": True, "split": "dev"}, "eval.split", "'dev' is no split of this task"),
        ({"k": -1}, "eval.k", "greater than or equal to 0"),
        ({"temperature": 0}, "eval.temperature", "greater than 0"),
        ({"problems": 0}, "eval.problems", "greater than or equal to 1"),
        ({"every": -2}, "eval.every", "greater than or equal to 0"),
        ({"evrey": 5}, "eval.evrey", "unknown key (did you mean eval.every?)"),
    ]
    for settings, field, message in cases:
        with pytest.raises(JobSpecError) as caught:
            parse_job_spec({**base, "eval": settings})
        assert caught.value.field == field and message in caught.value.message, caught.value.one_line()
    with pytest.raises(JobSpecError) as caught:  # a task without splits
        parse_job_spec({**base, "task": {"name": "arithmetic"}, "eval": {"after": True, "split": "test"}})
    assert caught.value.field == "eval.split" and "unknown option 'split'" in caught.value.message

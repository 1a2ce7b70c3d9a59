"""Task adapters: the arithmetic reward is computed from the prompt; bad task specs name the problem."""

from __future__ import annotations

import random
import re

import pytest

from dataplane.tasks import TaskSpecError, available_tasks, build_task
from dataplane.tasks.arithmetic import ArithmeticTask


@pytest.mark.parametrize(
    ("options", "prompt", "answer"),
    [
        ({}, "3+4=", "7"),
        ({}, "8+5=", "3"),  # 13 mod 10
        ({"modulus": 100}, "8+5=", "13"),
        ({"modulus": 7}, "9+9=", "4"),  # 18 mod 7
        ({"ops": "-"}, "3-5=", "8"),  # -2 mod 10, Python's non-negative remainder
        ({"ops": "*", "modulus": 100}, "6*7=", "42"),
        ({"ops": "*", "modulus": 10, "max_operand": 100}, "12*12=", "4"),  # 144 mod 10
    ],
)
def test_right_answer_scores_one(options: dict, prompt: str, answer: str) -> None:
    task = build_task({"name": "arithmetic", **options})

    assert task.reward(prompt, answer) == 1.0
    assert task.reward(prompt, f" {answer} ") == 1.0  # surrounding spaces are ignored


@pytest.mark.parametrize("completion", ["8", "13", "07", "7 7", "7+0", "", "   ", "seven", "=7"])
def test_wrong_or_malformed_answer_scores_zero(completion: str) -> None:
    assert build_task({"name": "arithmetic"}).reward("3+4=", completion) == 0.0


@pytest.mark.parametrize("prompt", ["3+4", "3+4=7", "a+b=", "3/4=", "+4=", "3++4=", "", " 3+4="])
def test_malformed_prompt_scores_zero_without_raising(prompt: str) -> None:
    task = build_task({"name": "arithmetic", "ops": "+-*"})

    assert task.reward(prompt, "7") == 0.0
    assert task.reward(prompt, "") == 0.0


def test_sampled_prompts_end_at_equals_and_are_answerable() -> None:
    task = ArithmeticTask(max_operand=20, ops="+-*", modulus=10)
    prompts = task.sample_prompts(random.Random(0), 500)

    assert len(prompts) == 500
    shape = re.compile(r"^(\d+)([+\-*])(\d+)=$")
    for p in prompts:
        match = shape.match(p.text)
        assert match, p.text
        assert p.text.split("=", 1)[1] == ""  # nothing after '=': the answer is never given away
        assert int(match[1]) <= 20 and int(match[3]) <= 20
        assert set(p.text) <= set(task.alphabet)
    assert {re.search(r"[+\-*]", p.text)[0] for p in prompts} == {"+", "-", "*"}


def test_sampling_is_reproducible_from_the_seed() -> None:
    task = build_task({"name": "arithmetic"})

    first = task.sample_prompts(random.Random(42), 50)
    assert task.sample_prompts(random.Random(42), 50) == first
    assert task.sample_prompts(random.Random(43), 50) != first


def test_spec_rebuilds_the_same_task() -> None:
    task = build_task({"name": "arithmetic", "ops": "+*", "modulus": 97, "max_operand": 50})

    assert task.spec() == {"name": "arithmetic", "max_operand": 50, "ops": "+*", "modulus": 97}
    assert build_task(task.spec()).spec() == task.spec()
    assert build_task({"name": "arithmetic"}).spec() == {"name": "arithmetic", "max_operand": 9, "ops": "+",
                                                         "modulus": 10}


def test_arithmetic_is_a_builtin_task() -> None:
    assert available_tasks()["arithmetic"] is ArithmeticTask


def test_unknown_task_is_refused_listing_available_ones() -> None:
    with pytest.raises(TaskSpecError, match=r"^task: unknown task 'chess'; available: .*arithmetic"):
        build_task({"name": "chess"})


@pytest.mark.parametrize("spec", [None, "arithmetic", {}, {"name": 3}, ["arithmetic"]])
def test_spec_without_a_name_is_refused(spec) -> None:
    with pytest.raises(TaskSpecError, match=r"^task: expected an object with a 'name'"):
        build_task(spec)


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"max_operand": 0}, "max_operand"),
        ({"max_operand": 10_001}, "max_operand"),
        ({"max_operand": "9"}, "max_operand"),
        ({"max_operand": 9.5}, "max_operand"),
        ({"ops": ""}, "ops"),
        ({"ops": "/"}, "ops"),
        ({"ops": "+x"}, "ops"),
        ({"modulus": 1}, "modulus"),
        ({"modulus": 10.0}, "modulus"),
        ({"modulus": 10**300}, "modulus"),  # answers no engine writes in max_new_tokens
        ({"colour": "blue"}, "colour"),
    ],
)
def test_bad_option_is_refused_naming_it(options: dict, option: str) -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "arithmetic", **options})

    assert option in str(err.value)


def test_non_string_ops_is_refused_naming_it() -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "arithmetic", "ops": 5})

    assert "ops" in str(err.value)


def test_a_misspelt_task_option_is_named_with_the_nearest_one() -> None:
    with pytest.raises(TaskSpecError) as refused:
        build_task({"name": "arithmetic", "max_operand": 20, "max_opernd": 3, "typo": 1})
    assert str(refused.value) == ("task: arithmetic: unknown option 'max_opernd' (did you mean 'max_operand'?); "
                                  "unknown option 'typo'; its options: max_operand, ops, modulus")

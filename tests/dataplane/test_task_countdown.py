"""The countdown task: safe exact evaluation, number bookkeeping, solvable seeded prompts, bad specs."""

from __future__ import annotations

import random

import pytest

from dataplane.tasks import TaskSpecError, available_tasks, build_task
from dataplane.tasks.countdown import TEMPLATE, CountdownTask, parse_prompt, solves

PROMPT = TEMPLATE.format(numbers="3, 7, 25, 50", target=82)
FRACTION_PROMPT = TEMPLATE.format(numbers="1, 3, 4, 6", target=24)


@pytest.fixture
def task() -> CountdownTask:
    return build_task({"name": "countdown"})


@pytest.mark.parametrize(
    ("prompt", "completion"),
    [
        (PROMPT, "<answer>3*25+7</answer>"),
        (PROMPT, "<answer> (3 * 25) + 7 </answer>"),
        (PROMPT, "I think 7 + 25*3 works.\n<answer>7 + 25*3 = 82</answer>"),  # '= target' is ignored
        (PROMPT, "<answer>1+1</answer> no: <answer>7+(25*3)</answer>"),  # the last answer counts
        (PROMPT, "3*25+7"),  # no tags: the last line
        (PROMPT, "<answer>50+25+7</answer>"),  # not every number has to be used
        (FRACTION_PROMPT, "<answer>6/(1-3/4)</answer>"),  # exact fractions, not floats
    ],
)
def test_right_answer_scores_one(task: CountdownTask, prompt: str, completion: str) -> None:
    assert task.reward(prompt, completion) == 1.0


@pytest.mark.parametrize(
    "completion",
    [
        "<answer>3*25+8</answer>",  # wrong value
        "<answer>3*25+7+3-3</answer>",  # 3 used three times
        "<answer>7*7+25+8</answer>",  # 7 twice, 8 not given
        "<answer>82</answer>",  # 82 is not a given number
        "<answer>25*3+7.0</answer>",  # floats are not given numbers
    ],
)
def test_wrong_answer_scores_zero(task: CountdownTask, completion: str) -> None:
    assert task.reward(PROMPT, completion) == 0.0


@pytest.mark.parametrize(
    "completion",
    [
        "",
        "<answer></answer>",
        "<answer>3*25+</answer>",
        "<answer>-3*-25+7</answer>",  # unary minus makes new numbers
        "<answer>3**4+1</answer>",  # powers are not allowed
        "<answer>(50//25)*41</answer>",
        "<answer>__import__('os').system('true')</answer>",
        "<answer>abs(-82)</answer>",
        "<answer>7/(25-25)+82</answer>",  # division by zero
        "<answer>3_0+52</answer>",
        "<answer>" + "(" * 500 + "3" + ")" * 500 + "</answer>",
        "<answer>" + "+".join(["3"] * 200) + "</answer>",
    ],
)
def test_malformed_answer_scores_zero_without_running_it(task: CountdownTask, completion: str) -> None:
    assert task.reward(PROMPT, completion) == 0.0


@pytest.mark.parametrize("prompt", ["", "3, 7 -> 10", PROMPT.replace("make 82", "make x"),
                                    "Using the numbers , make 5. "])
def test_malformed_prompt_scores_zero(task: CountdownTask, prompt: str) -> None:
    assert task.reward(prompt, "<answer>3*25+7</answer>") == 0.0


def test_every_sampled_prompt_is_solvable_and_parses_back() -> None:
    task = CountdownTask(count=4, max_number=25, max_target=1000)
    rng = random.Random(0)

    for _ in range(300):
        numbers, target, expression = task.make_problem(rng)
        assert len(numbers) == 4 and all(1 <= n <= 25 for n in numbers)
        assert 1 <= target <= 1000
        assert solves(numbers, target, expression), (numbers, target, expression)

    prompts = task.sample_prompts(random.Random(1), 100)
    for p in prompts:
        numbers, target = parse_prompt(p.text)
        assert len(numbers) == 4
        assert set(p.text) <= set(task.alphabet)
    assert len({p.text for p in prompts}) > 90


def test_sampling_is_reproducible_from_the_seed(task: CountdownTask) -> None:
    first = task.sample_prompts(random.Random(42), 20)

    assert task.sample_prompts(random.Random(42), 20) == first
    assert task.sample_prompts(random.Random(43), 20) != first


@pytest.mark.parametrize("ops", ["+", "-", "*", "/", "+-"])
def test_restricted_operators_still_give_solvable_prompts(ops: str) -> None:
    task = build_task({"name": "countdown", "ops": ops, "count": 3, "max_number": 9, "max_target": 100})
    rng = random.Random(0)

    for _ in range(50):
        numbers, target, expression = task.make_problem(rng)
        assert solves(numbers, target, expression)
        assert 1 <= target <= 100


def test_spec_round_trips_and_registry_switches_by_config() -> None:
    task = build_task({"name": "countdown", "count": 3, "ops": "+*", "max_number": 10, "max_target": 50})

    assert task.spec() == {"name": "countdown", "count": 3, "max_number": 10, "max_target": 50, "ops": "+*"}
    assert build_task(task.spec()).spec() == task.spec()
    assert available_tasks()["countdown"] is CountdownTask
    assert type(build_task({"name": "arithmetic"})).__name__ == "ArithmeticTask"  # one line switches the task


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({"count": 1}, "count"),
        ({"count": 7}, "count"),
        ({"count": "4"}, "count"),
        ({"count": True}, "count"),
        ({"max_number": 0}, "max_number"),
        ({"max_target": 0}, "max_target"),
        ({"max_target": 10, "max_number": 25}, "max_target"),
        ({"ops": ""}, "ops"),
        ({"ops": "+^"}, "ops"),
        ({"ops": "++"}, "ops"),
        ({"ops": 3}, "ops"),
        ({"numbers": [1, 2]}, "numbers"),
    ],
)
def test_bad_option_is_refused_naming_it(options: dict, option: str) -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "countdown", **options})

    assert option in str(err.value)

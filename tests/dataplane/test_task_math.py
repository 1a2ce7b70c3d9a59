"""The math task: final-answer extraction, number normalization, the prompt -> answer index, bad specs."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from dataplane.tasks import TaskSpecError, available_tasks, build_task
from dataplane.tasks.files import UNCONFINED, using
from dataplane.tasks.mathqa import DATA_DIR, MathTask, answers_match, extract_answer

SAMPLE = {"name": "math", "path": "builtin:math_sample.jsonl"}


@pytest.fixture(autouse=True)
def on_the_learners_machine():
    """These tests build the task as the learner and the agents do, reading any path; the test process is also a
    site (Django loaded), which reads only under its task data root (tests/marketplace/test_task_files.py)."""
    with using(UNCONFINED):
        yield


def write_jsonl(path: Path, rows: list) -> str:
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in rows))
    return str(path)


@pytest.fixture
def task(tmp_path) -> MathTask:
    rows = [
        {"problem": "What is 7 + 5?", "answer": "12"},
        {"problem": "Half of a third?", "answer": "\\frac{1}{6}"},
        {"problem": "Compute 1.5 + 2.25.", "answer": "3.75"},
        {"problem": "Seconds in 20 minutes?", "answer": "1,200"},
        {"problem": "Ten over four?", "answer": "5/2"},
        {"problem": "Solve 3x - 7 = -1.", "answer": 2},
        {"problem": "Where does y = x meet y = 2?", "answer": "(2,2)"},
        {"problem": "Negative half?", "answer": "-0.5"},
    ]
    return build_task({"name": "math", "path": write_jsonl(tmp_path / "problems.jsonl", rows), "template": "{problem}"})


@pytest.mark.parametrize(
    ("problem", "completion"),
    [
        ("What is 7 + 5?", "7 + 5 = 12, so the answer is \\boxed{12}."),
        ("What is 7 + 5?", "First \\boxed{11}; no wait: \\boxed{12}"),  # the last box counts
        ("What is 7 + 5?", "Natalia has 12.\n#### 12"),  # GSM8K style
        ("What is 7 + 5?", "$\\boxed{12.00}$"),  # trailing zeros
        ("What is 7 + 5?", "\\boxed{x = 12}"),
        ("Half of a third?", "\\boxed{\\dfrac{1}{6}}"),
        ("Half of a third?", "\\boxed{1/6}"),
        ("Half of a third?", "\\boxed{\\frac{2}{12}}"),  # equal value, not equal text
        ("Half of a third?", "\\boxed{\\frac16}"),
        ("Compute 1.5 + 2.25.", "\\boxed{\\frac{15}{4}}"),  # fraction == decimal
        ("Compute 1.5 + 2.25.", "#### 3.750"),
        ("Seconds in 20 minutes?", "\\boxed{1200}"),  # thousands separator in the reference
        ("Seconds in 20 minutes?", "\\boxed{1,200 \\text{ seconds}}"),
        ("Ten over four?", "\\boxed{2.5}"),
        ("Solve 3x - 7 = -1.", "\\boxed{2}"),  # numeric answer in the file
        ("Where does y = x meet y = 2?", "\\boxed{\\left( 2, 2 \\right)}"),  # non-numeric: normalized text
        ("Negative half?", "\\boxed{-\\frac{1}{2}}"),
    ],
)
def test_right_answer_scores_one(task: MathTask, problem: str, completion: str) -> None:
    assert task.reward(problem, completion) == 1.0


@pytest.mark.parametrize(
    ("problem", "completion"),
    [
        ("What is 7 + 5?", "\\boxed{13}"),
        ("What is 7 + 5?", "\\boxed{12} then \\boxed{13}"),  # only the last box counts
        ("What is 7 + 5?", "#### 120"),
        ("Half of a third?", "\\boxed{\\frac{1}{5}}"),
        ("Compute 1.5 + 2.25.", "\\boxed{3.74}"),
        ("Where does y = x meet y = 2?", "\\boxed{(2,3)}"),
        ("Negative half?", "\\boxed{\\frac{1}{2}}"),  # the sign matters
    ],
)
def test_wrong_answer_scores_zero(task: MathTask, problem: str, completion: str) -> None:
    assert task.reward(problem, completion) == 0.0


@pytest.mark.parametrize(
    "completion",
    ["12", "The answer is 12.", "", "\\boxed{12", "\\boxed{}", "####", "\\boxed{\\frac{1}{0}}", "\\boxed{{12}"],
)
def test_malformed_answer_scores_zero(task: MathTask, completion: str) -> None:
    assert task.reward("What is 7 + 5?", completion) == 0.0


def test_prompt_not_in_the_file_scores_zero(task: MathTask) -> None:
    assert task.reward("What is 7 + 6?", "\\boxed{13}") == 0.0
    assert task.reward("What is 7 + 5? ", "\\boxed{12}") == 0.0  # the index is by exact prompt text


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}"),  # nested braces
        ("\\boxed 7.", "7"),
        ("\\fbox{4}", "4"),
        ("#### 1,000\n", "1,000"),
        ("\\boxed{1} and #### 2", "1"),  # a box wins over ####
        ("no final answer", None),
        ("\\boxed{unclosed", None),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize(("a", "b"), [("0.5", "\\frac{1}{2}"), ("-3/6", "-.5"), ("1,000", "1000"), ("50\\%", "50"),
                                      ("\\tfrac{3}{4}", "0.75"), ("10^\\circ", "10")])
def test_equivalent_numbers_match(a: str, b: str) -> None:
    assert answers_match(a, b)


def test_sampled_prompts_come_from_the_file_and_follow_the_template() -> None:
    task = build_task(SAMPLE)
    prompts = task.sample_prompts(random.Random(0), 40)

    assert {p.text for p in prompts} <= set(task.answers)
    assert all(p.text.endswith("Put the final answer in \\boxed{}.") for p in prompts)
    assert task.sample_prompts(random.Random(0), 40) == prompts
    assert all(set(p.text) <= set(task.alphabet) for p in prompts)


def test_the_shipped_sample_scores_its_own_answers() -> None:
    task = build_task(SAMPLE)

    assert len(task.answers) >= 5
    for prompt, answer in task.answers.items():
        assert task.reward(prompt, f"\\boxed{{{answer}}}") == 1.0


def test_spec_round_trips_and_pins_the_file(tmp_path) -> None:
    task = build_task(SAMPLE)

    assert build_task(task.spec()).spec() == task.spec()
    assert set(task.spec()) == {"name", "path", "template", "sha256"}

    copy = tmp_path / "copy.jsonl"
    copy.write_bytes((DATA_DIR / "math_sample.jsonl").read_bytes() + b"\n")  # same problems, other bytes
    with pytest.raises(TaskSpecError, match=r"^sha256: .*differs"):
        build_task({**task.spec(), "path": str(copy)})


def test_math_is_a_builtin_task() -> None:
    assert available_tasks()["math"] is MathTask


@pytest.mark.parametrize(
    ("options", "option"),
    [
        ({}, "path"),
        ({"path": ""}, "path"),
        ({"path": 3}, "path"),
        ({"path": "/nonexistent/problems.jsonl"}, "path"),
        ({"path": "builtin:math_sample.jsonl", "template": "no placeholder"}, "template"),
        ({"path": "builtin:math_sample.jsonl", "sha256": "abc"}, "sha256"),
        ({"path": "builtin:math_sample.jsonl", "level": 5}, "level"),
    ],
)
def test_bad_option_is_refused_naming_it(options: dict, option: str) -> None:
    with pytest.raises(TaskSpecError) as err:
        build_task({"name": "math", **options})

    assert option in str(err.value)


@pytest.mark.parametrize(
    ("rows", "reason"),
    [
        (["not json"], "line 1: not JSON"),
        ([{"problem": "p"}], "line 1: expected an 'answer'"),
        ([{"answer": "1"}], "line 1: expected a non-empty string 'problem'"),
        ([{"problem": "p", "answer": "1"}, {"problem": "p", "answer": "2"}], "line 2: the same problem"),
        ([], "holds no problems"),
    ],
)
def test_bad_file_is_refused_with_the_line(tmp_path, rows: list, reason: str) -> None:
    path = write_jsonl(tmp_path / "bad.jsonl", rows)

    with pytest.raises(TaskSpecError, match=r"^path: ") as err:
        build_task({"name": "math", "path": path})

    assert reason in str(err.value)

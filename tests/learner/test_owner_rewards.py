"""Reward functions exactly as TRL users write them, scored on the learner (learner/scoring.py, docs/rewards.md):
each shape TRL's GRPOTrainer calls trains a few steps of a tiny model with a non-zero reward, on workers that did
not opt in to user code (the worker's task is prepared without it), through the learner's pool of processes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from dataplane.dataset import content
from dataplane.jobs import parse_job_spec
from dataplane.tasks import build_task
from learner.scoring import OwnerScoring
from tests.job_training import one_thread, train

pytest.importorskip("datasets")
pytest.importorskip("transformers")

ROOT = Path(__file__).resolve().parents[2]
SUMS = ROOT / "examples" / "data" / "sums.parquet"  # question, answer, max_term
STEPS = 3
# A chat template of the tiny tokenizer's characters: each message's role initial, then its content.
TEMPLATE = "{% for m in messages %}{{ m['role'][0] }}{{ m['content'] }}{% endfor %}"


def job(reward, *, path: Path = SUMS, fmt: str = "parquet", chat: bool = False, **data):
    digest = content.digest(path)
    content.register(digest, path)
    raw = {"name": "owner-rewards", "model_dir": "/models/tiny", "staleness": 3, "batch_trajectories": 32,
           "group_size": 8, "max_new_tokens": 2, "learning_rate": 1e-3, "max_steps": STEPS,
           "task": {"name": "dataset", "reward": reward,
                    "data": {"digest": digest, "format": fmt, "prompt_column": "question", **data}}}
    if chat:
        raw["prompt_format"] = {"chat": True}
    spec = parse_job_spec(raw)
    task = build_task(spec.task)
    task.prepare(allow_user_code=False)  # the worker's side: its provider did not opt in to user code
    return spec, task


def trained(spec, task, tmp_path, **kwargs) -> tuple[list[float], list[int]]:
    errors: list[int] = []
    with one_thread():
        rewards = train(spec, task, tmp_path, name="tiny", steps=STEPS, errors=errors, **kwargs)
    return rewards, errors


@pytest.mark.parametrize("function", ["plain", "correct", "with_columns", "by_ids", "by_state", "later"])
def test_each_trl_shape_trains_with_a_non_zero_reward_on_workers_that_did_not_opt_in(tmp_path, function) -> None:
    spec, task = job(f"tests.owner_rewards:{function}")
    assert task.user_code() == [], "scored on the learner: no worker runs the owner's code"
    assert task.reward_range == (0.0, 0.0), "a worker claims nothing for it: there is nothing to forge"

    rewards, errors = trained(spec, task, tmp_path)

    assert errors == [0] * STEPS
    assert all(r > 0 for r in rewards), rewards


def test_a_chat_job_gets_prompts_and_completions_as_messages(tmp_path) -> None:
    spec, task = job("tests.owner_rewards:chat", chat=True)

    rewards, errors = trained(spec, task, tmp_path, chat_template=TEMPLATE)

    assert errors == [0] * STEPS and all(r >= 0.2 for r in rewards), (rewards, errors)


def test_trls_own_reward_functions_score_unchanged(tmp_path) -> None:
    trl_rewards = pytest.importorskip("trl.rewards", reason="trl is in the dev extra")
    pytest.importorskip("math_verify")
    path = tmp_path / "data.jsonl"
    path.write_text("".join(json.dumps({"question": f"{a}+{b}=", "solution": f"${a + b}$"}) + "\n"
                            for a in range(5) for b in range(5)))
    reward = ["trl.rewards:accuracy_reward", "trl.rewards:think_format_reward",
              {"function": "trl.rewards:get_soft_overlong_punishment",
               "factory": {"max_completion_len": 2, "soft_punish_cache": 1}}]
    spec, task = job(reward, path=path, fmt="jsonl", chat=True)

    totals, each = task.owner_scores(["1+2="] * 2, [r"\boxed{3}", "<think>x</think>3"], completion_ids=[[5], [5, 6]],
                                     trainer_state=None, chat=spec.prompt_format)
    assert each == {"trl.rewards:accuracy_reward": [1.0, 0.0], "trl.rewards:think_format_reward": [0.0, 1.0],
                    "trl.rewards:get_soft_overlong_punishment": [0.0, -1.0]}, each
    assert trl_rewards.think_format_reward([[{"content": "<think>x</think>3"}]]) == [1.0]
    assert task.owner_stats().errors == 0

    rewards, errors = trained(spec, task, tmp_path / "model", chat_template=TEMPLATE)
    assert errors == [0] * STEPS and all(r != 0 for r in rewards), (rewards, errors)


def test_a_conversational_data_set_keeps_its_system_turn_and_trains(tmp_path) -> None:
    from dataplane.chat import prompt_text
    from learner.tiny import build_tokenizer

    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps({"question": [{"role": "system", "content": "sum"},
                                                     {"role": "user", "content": f"{a}+{b}="}],
                                        "answer": str(a + b)}) + "\n" for a in range(5) for b in range(5)))
    spec, task = job("tests.owner_rewards:conversation", path=path, fmt="jsonl", chat=True)
    tokenizer = build_tokenizer(task.alphabet)
    tokenizer.chat_template = TEMPLATE
    prompt = task.sample_prompts(__import__("random").Random(0), 1)[0].text
    assert prompt_text(tokenizer, prompt, spec.prompt_format).startswith("ssumu"), "system, then user: roles kept"

    rewards, errors = trained(spec, task, tmp_path / "model", chat_template=TEMPLATE)

    assert errors == [0] * STEPS and all(r > 0 for r in rewards), (rewards, errors)


@pytest.mark.parametrize(("function", "says"), [("broken", "ZeroDivisionError"), ("worded", "not a number")])
def test_a_function_that_cannot_score_is_caught_before_step_1(function, says) -> None:
    spec, _ = job(f"tests.owner_rewards:{function}")
    scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=STEPS, processes=1)
    try:
        problem = scoring.preflight()
    finally:
        scoring.close()
    assert f"tests.owner_rewards:{function}" in problem and says in problem, problem
    assert len(problem) <= 480
    if function == "broken":
        assert "owner_rewards.py" in problem and "1 / 0" in problem, "the end of the function's traceback"


def test_a_function_failing_on_most_records_asks_to_pause_the_job_with_the_reason() -> None:
    from types import SimpleNamespace

    from dataplane.packed import pack_records
    from dataplane.records import Trajectory

    spec, _ = job("tests.owner_rewards:flaky")
    scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=STEPS, processes=1, window=8,
                                   max_error_rate=0.5)

    def group(g: int, answers: list[str]) -> SimpleNamespace:
        records = [Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt="3+4=", prompt_ids=[1],
                              completion=a, completion_ids=[2], logprobs=[-1.0], reward=0.0, version=0)
                   for a in answers]
        return SimpleNamespace(entry_id=f"{g}-0", packed=pack_records(records))

    try:
        fine = scoring.apply([group(0, ["7", "5", "x", "7"]), group(1, ["7", "7", "7", "7"])], 0)
        assert (fine.errors, fine.pause_reason) == (1, "")  # 1 of 8 failed: under the threshold
        assert fine.means == {"tests.owner_rewards:flaky": pytest.approx((7 + 5 + 0 + 7 + 28) / 8)}
        bad = scoring.apply([group(2, ["x", "y", "7", "z"]), group(3, ["a", "b", "c", "7"])], 1)
    finally:
        scoring.close()
    assert bad.errors == 6 and "failed on 75% of the last 8 records (above 50%)" in bad.pause_reason
    assert "tests.owner_rewards:flaky: ValueError: invalid literal for int()" in bad.pause_reason


def test_a_function_that_kills_its_process_costs_its_group_not_the_learner() -> None:
    from types import SimpleNamespace

    from dataplane.packed import pack_records
    from dataplane.records import Trajectory

    spec, _ = job("tests.owner_rewards:dies")
    scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=STEPS, processes=1)

    def group(g: int, answers: list[str]) -> SimpleNamespace:
        records = [Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt="3+4=", prompt_ids=[1],
                              completion=a, completion_ids=[2], logprobs=[-1.0], reward=0.0, version=0)
                   for a in answers]
        return SimpleNamespace(entry_id=f"{g}-0", packed=pack_records(records))

    try:
        groups = [group(0, ["7", "die"]), group(1, ["7", "5"])]
        scores = scoring.apply(groups, 0)
        later = scoring.apply([group(2, ["1", "2"])], 1)
    finally:
        scoring.close()
    assert scores.errors == 2 and "a learner scoring process died" in scores.last_error, scores
    assert groups[0].packed.rewards == [0.0, 0.0] and groups[1].packed.rewards == [1.0, 1.0]
    assert later.errors == 0 and later.means == {"tests.owner_rewards:dies": 1.0}


def test_each_function_reports_its_mean_its_errors_and_its_last_error() -> None:
    from types import SimpleNamespace

    from dataplane.packed import pack_records
    from dataplane.records import Trajectory

    spec, _ = job(["tests.owner_rewards:flaky", "tests.owner_rewards:plain"])
    scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=STEPS, processes=1)
    records = [Trajectory(job_id=1, lease_id="l0", group_id="g0", prompt="3+4=", prompt_ids=[1], completion=a,
                          completion_ids=[2], logprobs=[-1.0], reward=0.0, version=0) for a in ["7", "x", "5", "y"]]
    try:
        first = scoring.apply([SimpleNamespace(entry_id="0-0", packed=pack_records(records))], 0)
        records = [r.model_copy(update={"group_id": "g1", "completion": "1"}) for r in records]
        second = scoring.apply([SimpleNamespace(entry_id="1-0", packed=pack_records(records))], 1)
    finally:
        scoring.close()
    flaky, plain = first.functions["tests.owner_rewards:flaky"], first.functions["tests.owner_rewards:plain"]
    assert (flaky["records"], flaky["errors"], flaky["mean"]) == (4, 2, pytest.approx(3.0))
    assert flaky["last_error"].startswith("tests.owner_rewards:flaky: ValueError: invalid literal for int()")
    assert plain == {"mean": 0.5, "records": 4, "errors": 0, "last_error": ""}
    # a batch without failures: no errors, and the function's latest failure still said
    assert second.functions["tests.owner_rewards:flaky"]["errors"] == 0
    assert second.functions["tests.owner_rewards:flaky"]["last_error"] == flaky["last_error"]

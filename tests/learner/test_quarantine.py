"""The learner never crashes on a bad record: each stored group is checked against the model before the loss;
a bad one is quarantined (acknowledged, counted per worker, reported) and the step goes on with the good ones.

The bad groups are written straight into the stream, as the site writes entries (``stream_fields``): the site
refuses them now, but a stream may hold entries it never checked (written before the checks, or before the
learner reported its vocabulary)."""

from __future__ import annotations

import json
from array import array
from pathlib import Path

import redis
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from dataplane import replay
from dataplane.jobs import JobSpec
from dataplane.packed import PackedRecords
from dataplane.records import RecordLimits
from dataplane.replay import StoredGroup
from dataplane.tasks import build_task
from learner import distributed
from learner.checkpoint import CheckpointStore
from learner.consumer import StalenessGatedConsumer
from learner.grpo import group_advantages
from learner.loop import LearnerLoop
from learner.policy import build_policy
from learner.quarantine import all_fit, model_vocab_size, stored_problem
from learner.report import step_metrics

from ..groups import entry_ids, stream_fields

JOB = 11


def records(group: int, *, completion_ids=(9, 2), reward: float = 1.0) -> list[dict]:
    return [{"job_id": JOB, "lease_id": f"l{group}", "group_id": f"g{group}", "prompt": "3+4=",
             "prompt_ids": [1, 10, 5, 11, 17], "completion": answer, "completion_ids": list(completion_ids),
             "logprobs": [-2.0, -1.0], "reward": reward if answer == "7" else 0.0, "version": 0}
            for answer in ("7", "5")]


def append(client, fields: dict) -> str:
    return client.xadd(replay.trajectories_key(JOB), fields)


def nan_reward_fields(group: int, *, worker_id: int) -> dict:
    """A group whose reward is NaN: no ``Trajectory`` can hold it, so its JSON (the form before the columns) is
    written by hand."""
    fields = stream_fields(records(group), worker_id=worker_id, legacy=True)
    return {**fields, "data": fields["data"].replace('"reward":1.0', '"reward":NaN', 1)}


def make_loop(redis_url: str, model_dir: Path, root: Path) -> LearnerLoop:
    """The loop as the learner builds it: the consumer checks against the task's and the model's limits."""
    spec = JobSpec(name="quarantine", model_dir=str(model_dir), task={"name": "arithmetic"}, staleness=50, kappa=1,
                   batch_trajectories=4, group_size=2, max_steps=10)
    trainer, _ = build_policy(spec, device="cpu")
    limits = build_task(spec.task).record_limits(max_new_tokens=spec.max_new_tokens,
                                                 vocab_size=model_vocab_size(trainer.module))
    consumer = StalenessGatedConsumer(redis.Redis.from_url(redis_url), JOB, spec.staleness, limits=limits)
    return LearnerLoop(spec=spec, trainer=trainer, consumer=consumer, checkpoints=CheckpointStore(root),
                       identity={"job_id": JOB, "created_at": "t0"})


def test_bad_groups_are_quarantined_counted_per_worker_and_never_read_again(redis_url, redis_client, tiny_model_dir,
                                                                            tmp_path) -> None:
    good = [append(redis_client, stream_fields(records(0), worker_id=1))]
    append(redis_client, stream_fields(records(1, completion_ids=(10**15, 2)), worker_id=5))  # IndexError before
    append(redis_client, stream_fields(records(2, reward=1e308), worker_id=6))  # NaN advantages before
    append(redis_client, nan_reward_fields(3, worker_id=6))  # a ValidationError in the reader before
    append(redis_client, {"lease_id": "l4", "worker_id": "7", "data": "{not json"})
    good.append(append(redis_client, stream_fields(records(5), worker_id=1)))
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    before = {k: v.clone() for k, v in loop.trainer.module.state_dict().items()}

    outcome = loop.step(timeout_s=5)

    assert outcome is not None and outcome.entry_ids == good  # the step went on with the good groups
    assert outcome.quarantined == 2 + 2 + 1 + 1  # records; an entry that is no group counts as one
    assert loop.consumer.quarantine.report() == {"5": 2, "6": 3, "7": 1}
    assert all(torch.isfinite(v).all() for v in loop.trainer.module.state_dict().values())
    assert any(not torch.equal(v, before[k]) for k, v in loop.trainer.module.state_dict().items())
    assert replay.ReplayBuffer(redis_client, JOB).counters()["quarantined_records"] == 6
    assert entry_ids(redis_client, replay.trajectories_key(JOB)) == []  # acknowledged

    extra = step_metrics(loop, outcome, distributed.DistContext())["extra"]  # the step report (metrics API)
    assert extra["quarantined"] == {"5": 2, "6": 3, "7": 1} and extra["quarantined_this_step"] == 6

    # A restarted learner reads none of them again, and keeps counting from the checkpoint's figures.
    again = make_loop(redis_url, tiny_model_dir, tmp_path)
    assert again.resume() is not None
    assert again.consumer.quarantine.report() == {"5": 2, "6": 3, "7": 1}
    append(redis_client, stream_fields(records(6, reward=-3.0), worker_id=8))  # outside the task's range [0, 1]
    later = [append(redis_client, stream_fields(records(g), worker_id=1)) for g in (7, 8)]
    outcome = again.step(timeout_s=5)
    assert outcome.entry_ids == later and outcome.quarantined == 2
    assert again.consumer.quarantine.report() == {"5": 2, "6": 3, "7": 1, "8": 2}


def test_a_bad_group_pending_from_a_crashed_run_is_quarantined_on_resume(redis_url, redis_client, tiny_model_dir,
                                                                         tmp_path) -> None:
    # Read (pending) by a learner that died before the checks existed: the next one must not crash on it.
    bad = append(redis_client, stream_fields(records(0, completion_ids=(10**15, 2)), worker_id=3))
    StalenessGatedConsumer(redis.Redis.from_url(redis_url), JOB, 50).replay.read("learner-0", count=1, block_ms=1)
    good = [append(redis_client, stream_fields(records(g), worker_id=1)) for g in (1, 2)]
    loop = make_loop(redis_url, tiny_model_dir, tmp_path)
    outcome = loop.step(timeout_s=5)
    assert outcome.entry_ids == good and outcome.quarantined == 2
    assert bad not in entry_ids(redis_client, replay.trajectories_key(JOB))


def test_the_advantage_of_a_group_with_a_non_finite_reward_is_zero_not_nan() -> None:
    rewards = torch.tensor([1.0, 0.0, float("nan"), 1.0, float("inf"), 0.0])
    groups = torch.tensor([0, 0, 1, 1, 2, 2])
    advantages = group_advantages(rewards, groups)
    assert torch.isfinite(advantages).all()
    assert advantages[2:].tolist() == [0.0, 0.0, 0.0, 0.0]
    assert torch.allclose(advantages[:2], torch.tensor([1.0, -1.0]) * 0.5**0.5, atol=1e-4)  # the unbiased std
    overflow = group_advantages(torch.tensor([1e308, 0.0], dtype=torch.float64).float(), torch.tensor([0, 0]))
    assert overflow.tolist() == [0.0, 0.0]


def test_the_learner_knows_its_models_vocabulary(tiny_model_dir) -> None:
    spec = JobSpec(name="v", model_dir=str(tiny_model_dir), task={"name": "arithmetic"}, staleness=2,
                   batch_trajectories=4, group_size=2)
    trainer, tokenizer = build_policy(spec, device="cpu")
    assert model_vocab_size(trainer.module) == len(tokenizer)
    assert json.loads(json.dumps(model_vocab_size(trainer.module))) > 17  # reported to the site as JSON


@st.composite
def packs(draw) -> PackedRecords:
    """Records in columns with values anywhere: out of the vocabulary, negative, NaN, infinite, out of range."""
    n = draw(st.integers(1, 4))
    token = st.integers(-3, 40) | st.sampled_from([2**63 - 1, -(2**63)])
    number = st.floats(allow_nan=True, allow_infinity=True) | st.floats(-2e4, 1.0)
    prompt = draw(st.text(max_size=3))
    prompt_lens = [draw(st.integers(1, 24)) for _ in range(n)]
    completion_lens = [draw(st.integers(1, 6)) for _ in range(n)]
    tokens = draw(st.lists(token, min_size=sum(prompt_lens) + sum(completion_lens),
                           max_size=sum(prompt_lens) + sum(completion_lens)))
    flat = sum(completion_lens)
    return PackedRecords(
        group_ids=["g"] * n, versions=[0] * n, rewards=draw(st.lists(number, min_size=n, max_size=n)),
        prompts=[prompt] * n, completions=["c"] * n, prompt_lens=prompt_lens, completion_lens=completion_lens,
        tokens=array("q", tokens), logprobs=array("d", draw(st.lists(number, min_size=flat, max_size=flat))),
        mask=array("q", draw(st.lists(st.integers(-1, 2), min_size=flat, max_size=flat))))


@settings(max_examples=400, deadline=None)
@given(packs(), st.sampled_from([None, 20, 41]), st.integers(1, 6))
def test_the_whole_read_check_passes_exactly_what_the_record_by_record_check_passes(packed, vocab, longest) -> None:
    """``all_fit`` (a few array reductions over a whole read) never passes a record that ``stored_problem`` (the
    site's own record checks, record by record) refuses, and never refuses a read whose records all pass."""
    limits = RecordLimits(vocab_size=vocab, max_completion_tokens=longest, reward_range=(-10.0, 10.0))
    problem, _ = stored_problem(StoredGroup("1-0", None, 1, packed=packed), limits)
    assert all_fit(packed, limits) == (problem == "")

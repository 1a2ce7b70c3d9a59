"""Collation puts each completion token where the learner scores it, and the learner's log-probs of a
sampled completion equal those the worker's engine reported (ratio 1 on-policy)."""

from __future__ import annotations

import pytest
import torch

from dataplane.records import Trajectory
from dataplane.tasks import build_task
from learner.batch import collate, token_logprobs
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine
from worker_agent.rollout import GroupLease, rollout_groups

PAD = 0


def trajectory(group_id: str, prompt_ids: list[int], completion_ids: list[int], logprobs: list[float], *,
               reward: float = 0.0, version: int = 0, loss_mask: list[int] | None = None) -> Trajectory:
    return Trajectory(job_id=1, lease_id="1-0", group_id=group_id, prompt="p", prompt_ids=prompt_ids,
                      completion="c", completion_ids=completion_ids, logprobs=logprobs, reward=reward,
                      version=version, loss_mask=loss_mask)


def test_collate_places_completion_tokens_at_their_scoring_positions() -> None:
    records = [
        trajectory("g1", [1, 5, 6], [7, 2], [-0.1, -0.2], reward=1.0, version=4),
        trajectory("g0", [1, 5, 6, 7], [8, 9, 2], [-0.3, -0.4, -0.5], reward=0.5, version=2, loss_mask=[1, 0, 1]),
        trajectory("g1", [1, 3], [4], [-0.6], reward=0.0, version=3),
    ]

    batch = collate(records, pad_id=PAD)

    # width = longest prompt + completion = 7; position t predicts token t + 1
    assert batch.input_ids.tolist() == [[1, 5, 6, 7, 2, PAD, PAD],
                                        [1, 5, 6, 7, 8, 9, 2],
                                        [1, 3, 4, PAD, PAD, PAD, PAD]]
    assert batch.attention.tolist() == [[1, 1, 1, 1, 1, 0, 0],
                                        [1, 1, 1, 1, 1, 1, 1],
                                        [1, 1, 1, 0, 0, 0, 0]]
    assert batch.token_mask.tolist() == [[0, 0, 1, 1, 0, 0],
                                         [0, 0, 0, 1, 0, 1],  # the loss mask silences the middle token
                                         [0, 1, 0, 0, 0, 0]]
    torch.testing.assert_close(batch.behaviour_logp, torch.tensor([[0, 0, -0.1, -0.2, 0, 0],
                                                                   [0, 0, 0, -0.3, -0.4, -0.5],
                                                                   [0, -0.6, 0, 0, 0, 0]]))
    assert batch.rewards.tolist() == [1.0, 0.5, 0.0]
    assert batch.group_index.tolist() == [0, 1, 0]  # groups numbered in order of first appearance
    assert batch.versions.tolist() == [4, 2, 3]

    # wherever a completion token learns or is scored, the next input token is that completion token
    for row, rec in enumerate(records):
        start = len(rec.prompt_ids) - 1
        scored = batch.input_ids[row, start + 1 : start + 1 + len(rec.completion_ids)]
        assert scored.tolist() == rec.completion_ids


@pytest.fixture(scope="module")
def engine(tiny_model_dir) -> HFEngine:
    return HFEngine(str(tiny_model_dir), device="cpu", seed=0)


def test_learner_logprobs_equal_engine_logprobs_on_policy(engine: HFEngine, tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM

    task = build_task({"name": "arithmetic", "max_operand": 100})
    # prompts of different lengths, so the engine left-pads while the learner right-pads
    leases = [GroupLease(lease_id=f"1-{i}", group_id=f"g{i}", prompt=p)
              for i, p in enumerate(["3+4=", "12+57=", "100+1="])]
    groups = rollout_groups(engine, task, leases, job_id=1, n=4, params=SamplingParams(max_new_tokens=6),
                            version=0)
    records = [r for g in groups for r in g.records]
    lengths = {len(r.completion_ids) for r in records}
    assert len(lengths) > 1, "want completions of several lengths (some stop early at eos)"

    learner_model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    batch = collate(records, pad_id=engine.tokenizer.pad_token_id)
    with torch.no_grad():
        logp = token_logprobs(learner_model, batch)

    assert logp.shape == batch.token_mask.shape
    mask = batch.token_mask.bool()
    assert int(mask.sum()) == sum(len(r.completion_ids) for r in records)
    torch.testing.assert_close(logp[mask], batch.behaviour_logp[mask], rtol=0, atol=1e-4)
    ratio = torch.exp(logp[mask] - batch.behaviour_logp[mask])
    torch.testing.assert_close(ratio, torch.ones_like(ratio), rtol=0, atol=1e-4)


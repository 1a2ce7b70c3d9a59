"""Collation puts each completion token where the learner scores it, and the learner's log-probs of a
sampled completion equal those the worker's engine reported (ratio 1 on-policy)."""

from __future__ import annotations

import random

import pytest
import torch

from dataplane.packed import pack_json
from dataplane.records import Trajectory, TrajectoryGroup
from dataplane.tasks import build_task
from learner.batch import Workspace, collate, collate_packed, concat, token_logprobs
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



def reference_collate(records: list[Trajectory], *, pad_id: int) -> dict[str, torch.Tensor]:
    """The learner's collation before records were read in columns: four small tensors per record."""
    width = max(len(r.prompt_ids) + len(r.completion_ids) for r in records)
    size = len(records)
    input_ids = torch.full((size, width), pad_id, dtype=torch.long)
    attention = torch.zeros((size, width), dtype=torch.long)
    token_mask = torch.zeros((size, width - 1), dtype=torch.float32)
    behaviour = torch.zeros((size, width - 1), dtype=torch.float32)
    groups: dict[str, int] = {}
    for row, rec in enumerate(records):
        seq = rec.prompt_ids + rec.completion_ids
        input_ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        start, n = len(rec.prompt_ids) - 1, len(rec.completion_ids)
        mask = rec.loss_mask if rec.loss_mask is not None else [1] * n
        token_mask[row, start : start + n] = torch.tensor(mask, dtype=torch.float32)
        behaviour[row, start : start + n] = torch.tensor(rec.logprobs, dtype=torch.float32)
        groups.setdefault(rec.group_id, len(groups))
    return {"input_ids": input_ids, "attention": attention, "token_mask": token_mask, "behaviour_logp": behaviour,
            "rewards": torch.tensor([r.reward for r in records], dtype=torch.float32),
            "group_index": torch.tensor([groups[r.group_id] for r in records], dtype=torch.long),
            "versions": torch.tensor([r.version for r in records], dtype=torch.long)}


def random_groups(rng: random.Random, count: int, *, longest: int) -> list[list[Trajectory]]:
    out = []
    for g in range(count):
        prompt, version = [1, *(rng.randrange(3, 30) for _ in range(rng.randint(1, 6)))], rng.randrange(4)
        out.append([trajectory(f"g{g % 3}", prompt, [rng.randrange(3, 30) for _ in range(n)],
                               [-rng.uniform(0, 5) for _ in range(n)], reward=rng.random(), version=version,
                               loss_mask=[rng.randrange(2) for _ in range(n)] if rng.random() < 0.5 else None)
                    for n in (rng.randint(1, longest) for _ in range(rng.randint(1, 4)))])
    return out


def test_collation_from_columns_equals_the_record_by_record_collation() -> None:
    """Batches collated from the columns the reader packs (group by group, joined, into reused buffers) hold
    exactly what the old collation built, batch after batch (a reused buffer carries nothing over)."""
    rng, workspace = random.Random(7), Workspace()
    for longest in (1, 3, 40, 7):  # a wide batch, then narrower ones in the same (larger) buffers
        groups = random_groups(rng, 6, longest=longest)
        records = [r for g in groups for r in g]
        stored = [pack_json(TrajectoryGroup.of(g).model_dump_json()) for g in groups]

        batch = collate_packed(concat(stored, workspace), pad_id=PAD, workspace=workspace)

        expected = reference_collate(records, pad_id=PAD)
        for name, tensor in expected.items():
            assert torch.equal(getattr(batch, name), tensor), (longest, name)
        assert all(torch.equal(getattr(collate(records, pad_id=PAD), n), t) for n, t in expected.items())


def test_an_empty_batch_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one record"):
        collate([], pad_id=PAD)

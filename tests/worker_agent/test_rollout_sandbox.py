"""Multi-turn rollouts: the agent plays whole sandbox episodes and returns records with turn-aware masks."""

from __future__ import annotations

import pytest

from dataplane.records import TrajectoryGroup
from dataplane.tasks import build_task
from learner.tiny import build_tiny_model
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine
from worker_agent.rollout import GroupLease, rollout_groups


@pytest.fixture(scope="module")
def sandbox_engine(tmp_path_factory):
    task = build_task({"name": "sandbox", "max_turns": 3})
    model = build_tiny_model(tmp_path_factory.mktemp("m") / "tiny-sandbox", alphabet=task.alphabet, hidden=32,
                             layers=1)
    return task, HFEngine(str(model), seed=0)


def test_episodes_become_valid_records_whose_mask_covers_only_assistant_turns(sandbox_engine):
    import random

    task, engine = sandbox_engine
    prompts = task.sample_prompts(random.Random(0), 2)
    leases = [GroupLease(f"{i}-0", f"g{i}", p.text) for i, p in enumerate(prompts)]
    groups = rollout_groups(engine, task, leases, job_id=1, n=3, params=SamplingParams(max_new_tokens=6), version=4)
    assert [len(g.records) for g in groups] == [3, 3]
    for lease, group in zip(leases, groups, strict=True):
        group = TrajectoryGroup.model_validate_json(group.model_dump_json())  # as the site parses it
        group.check_for_job(job_id=1, group_size=3, max_version=4)
        for record in group.records:
            assert record.lease_id == lease.lease_id and record.version == 4
            assert record.reward == task.reward(lease.prompt, record.completion)  # the return, replayed from text
            turns = record.metadata["turns"]
            assert 1 <= turns <= 3
            learned = sum(record.loss_mask)
            assert 0 < learned <= turns * 6  # assistant tokens only: at most max_new_tokens per turn
            if learned < len(record.completion_ids):  # the environment replied: its tokens do not learn
                assert all(lp == 0.0 for lp, m in zip(record.logprobs, record.loss_mask, strict=True) if m == 0)


def test_stop_strings_end_a_turn(sandbox_engine):
    _, engine = sandbox_engine
    prompt = engine.encode_prompt("x")
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    ((free,),) = engine.generate_ids([prompt], n=1, params=greedy)
    assert len(free.text) > 1, "the tiny model stopped at once; pick another prompt"
    ((stopped,),) = engine.generate_ids([prompt], n=1, params=greedy, stop=[free.text[:1]])
    assert stopped.text == free.text[:1]  # ended right after the stop string, which is kept
    assert stopped.completion_ids == free.completion_ids[:len(stopped.completion_ids)]

"""The Hugging Face engine on the tiny model: group shapes, stopping, log-probs, weight installs, greedy."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from dataplane.records import TrajectoryGroup
from dataplane.tasks import build_task
from worker_agent.engines.base import SamplingParams
from worker_agent.engines.hf import HFEngine
from worker_agent.rollout import GroupLease, rollout_groups

PROMPTS = ["3+4=", "12+5=", "9+9="]


@pytest.fixture
def engine(tiny_model_dir) -> HFEngine:
    return HFEngine(str(tiny_model_dir), device="cpu", seed=0)


def test_generates_n_completions_per_prompt(engine: HFEngine) -> None:
    groups = engine.generate(PROMPTS, n=5, params=SamplingParams(max_new_tokens=6))

    assert [len(g) for g in groups] == [5, 5, 5]
    for prompt, group in zip(PROMPTS, groups, strict=True):
        for c in group:
            assert c.prompt_ids == engine.encode_prompt(prompt)


def test_completions_stop_at_eos_or_max_new_tokens(engine: HFEngine) -> None:
    eos = engine.tokenizer.eos_token_id
    max_new = 6
    completions = [c for g in engine.generate(PROMPTS, n=8, params=SamplingParams(max_new_tokens=max_new))
                   for c in g]

    for c in completions:
        assert 1 <= len(c.completion_ids) <= max_new
        assert c.completion_ids[-1] == eos or len(c.completion_ids) == max_new
        assert eos not in c.completion_ids[:-1]  # nothing is kept after the first eos
        assert len(c.logprobs) == len(c.completion_ids)
        assert all(lp <= 0.0 for lp in c.logprobs)
        assert c.text == engine.tokenizer.decode(c.completion_ids, skip_special_tokens=True)
    assert any(c.completion_ids[-1] == eos for c in completions), "the untrained model should stop sometimes"
    assert any(len(c.completion_ids) == max_new and c.completion_ids[-1] != eos for c in completions)


def test_prompt_starts_with_bos(engine: HFEngine) -> None:
    ids = engine.encode_prompt("3+4=")

    assert ids[0] == engine.tokenizer.bos_token_id
    assert engine.tokenizer.decode(ids, skip_special_tokens=True) == "3+4="


def test_rollout_records_validate(engine: HFEngine) -> None:
    task = build_task({"name": "arithmetic"})
    leases = [GroupLease(lease_id=f"17-{i}", group_id=f"g{i}", prompt=p) for i, p in enumerate(PROMPTS)]

    groups = rollout_groups(engine, task, leases, job_id=3, n=4, params=SamplingParams(max_new_tokens=4),
                            version=2)

    assert len(groups) == 3
    for lease, group in zip(leases, groups, strict=True):
        group = TrajectoryGroup.model_validate_json(group.model_dump_json())  # as the site parses it
        group.check_for_job(job_id=3, group_size=4, max_version=2)
        for rec in group.records:
            assert (rec.lease_id, rec.group_id, rec.prompt, rec.version) == (lease.lease_id, lease.group_id,
                                                                             lease.prompt, 2)
            assert rec.reward == task.reward(lease.prompt, rec.completion)


def test_greedy_is_deterministic(engine: HFEngine, tiny_model_dir) -> None:
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    other = HFEngine(str(tiny_model_dir), device="cpu", seed=123)

    first = engine.generate(PROMPTS, n=3, params=greedy)
    second = engine.generate(PROMPTS, n=3, params=greedy)
    third = other.generate(PROMPTS, n=3, params=greedy)

    assert first == second == third
    for group in first:
        assert group[0] == group[1] == group[2]


@pytest.mark.parametrize("temperature", [0.0, 0.005])
def test_greedy_decodes_once_and_returns_n_copies(engine: HFEngine, temperature: float) -> None:
    """Below temperature 0.01 is greedy on every engine (vLLM cannot sample there); n samples are one, n times."""
    greedy = engine.generate(PROMPTS, n=4, params=SamplingParams(max_new_tokens=6, temperature=temperature))
    single = engine.generate(PROMPTS, n=1, params=SamplingParams(max_new_tokens=6, temperature=0.0))

    assert greedy == [group * 4 for group in single]


def test_sampling_is_reproducible_from_the_seed(tiny_model_dir) -> None:
    params = SamplingParams(max_new_tokens=6)

    a = HFEngine(str(tiny_model_dir), device="cpu", seed=7).generate(PROMPTS, n=4, params=params)
    b = HFEngine(str(tiny_model_dir), device="cpu", seed=7).generate(PROMPTS, n=4, params=params)

    assert a == b
    assert len({tuple(c.completion_ids) for g in a for c in g}) > 1  # temperature 1 really samples


def test_load_weights_changes_generation_logprobs(engine: HFEngine) -> None:
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    original = {k: v.clone() for k, v in engine.model.state_dict().items()}
    before = engine.generate(PROMPTS, n=1, params=greedy)

    generator = torch.Generator().manual_seed(0)
    modified = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
    engine.load_weights(modified)
    after = engine.generate(PROMPTS, n=1, params=greedy)

    assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before]

    engine.load_weights(original)  # installing the old snapshot again restores the old policy exactly
    assert engine.generate(PROMPTS, n=1, params=greedy) == before


def test_load_weights_without_the_tied_head_is_accepted(engine: HFEngine) -> None:
    state = {k: v.clone() for k, v in engine.model.state_dict().items() if k != "lm_head.weight"}

    engine.load_weights(state)


def test_load_weights_that_do_not_fit_are_refused(engine: HFEngine) -> None:
    state = dict(engine.model.state_dict())

    with pytest.raises(ValueError, match="unexpected"):
        engine.load_weights({**state, "model.layers.9.mlp.up_proj.weight": torch.zeros(2, 2)})
    with pytest.raises(ValueError, match="missing"):
        engine.load_weights({k: v for k, v in state.items() if "layers.0.mlp" not in k})


@pytest.mark.slow
def test_hf_engine_runs_on_the_oldest_transformers_the_pins_allow() -> None:
    """scripts/hf-engine-compat.sh makes (once; kept under ~/.cache/echo2) a venv with the oldest transformers that
    pyproject.toml allows and runs the engine's checks there: the cache names moved in transformers 5.24."""
    root = Path(__file__).resolve().parents[2]
    done = subprocess.run(["bash", str(root / "scripts" / "hf-engine-compat.sh")], capture_output=True, text=True,
                          timeout=1200, env={**os.environ, "PYTHON": sys.executable})

    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "5 passed, 0 failed" in done.stdout

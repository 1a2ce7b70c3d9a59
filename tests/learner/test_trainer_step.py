"""One GRPO step on the tiny model moves the policy toward the rewarded completion."""

from __future__ import annotations

import pytest
import torch

from dataplane.records import Trajectory
from learner.batch import collate, token_logprobs
from learner.trainer import grpo_step


@pytest.fixture
def policy(tiny_model_dir):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir), AutoTokenizer.from_pretrained(tiny_model_dir)


def completion_logprobs(model, records: list[Trajectory], pad_id: int) -> list[float]:
    """Sum of the log-probs of each record's completion tokens under ``model``."""
    batch = collate(records, pad_id=pad_id)
    model.eval()
    with torch.no_grad():
        logp = token_logprobs(model, batch)
    return (logp * batch.token_mask).sum(dim=1).tolist()


def make_group(tokenizer, group_id: str, prompt: str, answers: dict[str, float]) -> list[Trajectory]:
    prompt_ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    return [
        Trajectory(job_id=1, lease_id=f"lease-{group_id}", group_id=group_id, prompt=prompt, prompt_ids=prompt_ids,
                   completion=answer,
                   completion_ids=[*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id],
                   logprobs=[-1.0] * (len(answer) + 1), reward=reward, version=0)
        for answer, reward in answers.items()
    ]


def on_policy(model, records: list[Trajectory], pad_id: int) -> list[Trajectory]:
    """The records with the behaviour log-probs a worker holding ``model`` would have reported."""
    batch = collate(records, pad_id=pad_id)
    with torch.no_grad():
        logp = token_logprobs(model.eval(), batch)
    out = []
    for row, rec in enumerate(records):
        start = len(rec.prompt_ids) - 1
        out.append(rec.model_copy(update={"logprobs": logp[row, start:start + len(rec.completion_ids)].tolist()}))
    return out


def test_grpo_step_raises_the_rewarded_completion(policy) -> None:
    model, tokenizer = policy
    pad = tokenizer.pad_token_id
    records = on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                                *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})], pad)
    before_params = {name: p.detach().clone() for name, p in model.named_parameters()}
    before = completion_logprobs(model, records, pad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    result = grpo_step(model, optimizer, records, pad_id=pad, clip_eps=0.2, device="cpu")

    changed = [name for name, p in model.named_parameters() if not torch.equal(p.detach(), before_params[name])]
    assert changed, "no parameter moved"
    after = completion_logprobs(model, records, pad)
    assert after[0] > before[0]  # "7" for 3+4= had reward 1
    assert after[3] > before[3]  # "4" for 2+2= had reward 1
    assert after[1] < before[1]  # "5" for 3+4= had reward 0
    assert after[2] < before[2]  # "1" for 2+2= had reward 0
    # on-policy (ratio 1), advantages +-1 over equally long completions: the surrogate is -mean(A) = 0
    assert result.loss == pytest.approx(0.0, abs=1e-5)
    assert result.reward_mean == 0.5
    assert result.reward_std == 0.5
    assert result.clip_fraction == 0.0
    assert result.tokens == 8  # four completions of answer + eos

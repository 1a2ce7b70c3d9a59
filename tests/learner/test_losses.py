"""The policy-loss registry: every module of learner/losses/ is a registered variant a job can name, and a variant
registered by a test (one class plus its declared name) is what a job trains with."""

from __future__ import annotations

import pkgutil

import pytest
import torch

import learner.losses
from dataplane.jobs import LossConfig
from dataplane.losses import LOSS_TYPES, LossType
from learner.losses import POLICY_LOSSES, PolicyLoss, Surrogate, get_policy_loss, register_policy_loss

from .helpers import grpo_step, loss_config
from .test_trainer_step import completion_logprobs, make_group, on_policy


def test_every_module_of_the_folder_is_a_registered_variant_a_job_can_name() -> None:
    variants = {m.name for m in pkgutil.iter_modules(learner.losses.__path__)} - set(learner.losses.SHARED)

    assert variants == set(POLICY_LOSSES) == set(LOSS_TYPES)  # the learner's registry and the site's names agree
    assert all(type(POLICY_LOSSES[name]).__module__ == f"learner.losses.{name}" for name in variants)


def test_a_job_naming_an_undeclared_variant_is_refused_with_the_declared_ones() -> None:
    assert "ppo" not in LOSS_TYPES
    with pytest.raises(ValueError, match=f"unknown loss type 'ppo'; available: {', '.join(LOSS_TYPES)} "):
        LossConfig(type="ppo")
    assert LossConfig.model_json_schema()["properties"]["type"]["enum"] == list(LOSS_TYPES)
    with pytest.raises(ValueError, match=f"unknown loss type 'ppo'; one of {', '.join(POLICY_LOSSES)}$"):
        get_policy_loss("ppo")


@pytest.fixture
def reinforce(monkeypatch):
    """A toy variant, REINFORCE (Williams, 1992): surrogate ``A * logp``, no ratio, no clip; counts its calls."""
    monkeypatch.setitem(LOSS_TYPES, "reinforce", LossType("reinforce", "A * log-prob, no clip"))
    calls = []

    class Reinforce(PolicyLoss):
        def surrogate(self, logp, old_logp, advantages, mask, config) -> Surrogate:
            calls.append(logp.shape)
            never = torch.zeros_like(mask, dtype=torch.bool)
            return Surrogate(advantages[:, None] * logp, torch.exp(logp - old_logp).detach(), never, never, never)

    monkeypatch.delitem(POLICY_LOSSES, "reinforce", raising=False)
    register_policy_loss("reinforce")(Reinforce)
    yield calls
    POLICY_LOSSES.pop("reinforce", None)


def test_a_variant_registered_here_is_what_the_job_trains_with(reinforce, tiny_model_dir) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    pad = tokenizer.pad_token_id
    records = on_policy(model, [*make_group(tokenizer, "a", "3+4=", {"7": 1.0, "5": 0.0}),
                                *make_group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0})], pad)
    settings = loss_config(type="reinforce")  # validated like a job's loss: the declared name is accepted
    before = completion_logprobs(model, records, pad)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    losses = [grpo_step(model, optimizer, records, pad_id=pad, loss=settings).loss for _ in range(3)]

    assert len(reinforce) == 3  # one micro-batch per step, through the toy's surrogate
    assert losses[0] > losses[1] > losses[2]  # -mean(A * logp) falls as the rewarded answers grow likelier
    after = completion_logprobs(model, records, pad)
    assert after[0] > before[0] and after[3] > before[3]  # the rewarded answers "7" and "4"
    assert after[1] < before[1] and after[2] < before[2]

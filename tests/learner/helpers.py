"""Helpers for the learner's tests: a resolved loss configuration and one GRPO update in this process."""

from __future__ import annotations

import torch

from dataplane.chat import prompt_ids as build_prompt_ids
from dataplane.jobs import LossConfig
from dataplane.records import Trajectory
from learner import distributed
from learner.step import PolicyTrainer, StepResult


def loss_config(*, clip_eps: float = 0.2, max_new_tokens: int = 1, **fields) -> LossConfig:
    """``LossConfig(**fields)`` resolved as a job with ``clip_eps`` and ``max_new_tokens`` would resolve it
    (the defaults: grpo, token-mean, behaviour ratio, eps 0.2/0.2, no KL, norm_length 1)."""
    return LossConfig(**fields).resolved(clip_eps=clip_eps, max_new_tokens=max_new_tokens)


def grpo_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, records: list[Trajectory], *, pad_id: int,
              loss: LossConfig | None = None, clip_eps: float = 0.2, device: str = "cpu") -> StepResult:
    """One optimizer update of the GRPO loss on whole groups, in this process (the learner keeps one
    :class:`PolicyTrainer` instead)."""
    trainer = PolicyTrainer(model, optimizer, loss or loss_config(clip_eps=clip_eps), pad_id=pad_id,
                            ctx=distributed.DistContext(device=device))
    return trainer.step(records)


def trained_snapshots(model_dir, root, job_id: int):
    """The tiny model at ``model_dir`` after one GRPO step, published under ``root`` (a learner's
    ``SnapshotStore``, in 4 KiB chunks, fp32) as version 2 beside its base, version 0; returns (model, store)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from learner.snapshots import SnapshotStore

    model = AutoModelForCausalLM.from_pretrained(model_dir)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    prompt_ids = build_prompt_ids(tokenizer, "3+4=")  # as the engines prompt it (dataplane/chat.py)
    records = [Trajectory(job_id=job_id, lease_id="lease-g", group_id="g", prompt="3+4=", prompt_ids=prompt_ids,
                          completion=answer, completion_ids=[*tokenizer(answer, add_special_tokens=False)["input_ids"],
                                                             tokenizer.eos_token_id],
                          logprobs=[-1.0, -1.0], reward=reward, version=0)
               for answer, reward in (("7", 1.0), ("5", 0.0))]
    grpo_step(model, torch.optim.AdamW(model.parameters(), lr=1e-2), records, pad_id=tokenizer.pad_token_id)
    assert any(not torch.equal(before[k], v) for k, v in model.state_dict().items())  # it did train
    store = SnapshotStore(root, job_id=job_id, chunk_bytes=4096, dtype="fp32")  # exported as trained: fp32
    store.write_base(model_dir)
    store.write(model, 2)
    return model, store

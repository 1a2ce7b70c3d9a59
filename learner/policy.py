"""The job's policy as the learner trains it: the checkpoint loaded with fp32 master weights (a LoRA job's wrapped
with its adapter, the base frozen: learner/lora.py), its frozen reference when the loss has a KL term, both placed
(one device, or sharded with FSDP2 across the ranks: ``learner/fsdp.py``), and the optimizer over what this rank
holds and trains."""

from __future__ import annotations

from typing import Any

import torch

from dataplane.jobs import JobSpec

from . import distributed, fsdp, lora
from .step import PolicyTrainer


def load_model(model_dir: str) -> torch.nn.Module:
    """The checkpoint at ``model_dir`` with fp32 weights, whatever dtype it was saved in: the learner's parameters
    are the master weights AdamW updates (bf16 only inside autocast or FSDP's mixed precision). transformers 5
    loads a checkpoint in the dtype its config names, and released checkpoints are bf16: an update at lr 1e-6
    moves almost no bf16 weight (their spacing near 0.02 is 1.2e-4), so such a policy would barely learn."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)


def build_policy(spec: JobSpec, *, device: str, ctx: distributed.DistContext | None = None, micro_batch=None,
                 bf16: bool = False, parallel: str = "ddp",
                 activation_checkpointing: bool = False) -> tuple[PolicyTrainer, Any]:
    """Load the job's model (and, with a KL term, a frozen copy as reference), sharded across the ranks with
    ``parallel="fsdp"`` (learner/fsdp.py), the optimizer made over what this rank holds; returns
    (trainer, tokenizer)."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the learner logs lines, not bars
    ctx = ctx or distributed.DistContext(device=device)
    if parallel not in fsdp.PARALLEL:
        raise ValueError(f"parallel must be one of {', '.join(fsdp.PARALLEL)}, got {parallel!r}")
    sharded = parallel == "fsdp" and ctx.parallel  # alone, FSDP is the plain model

    def place(model: torch.nn.Module) -> torch.nn.Module:
        return fsdp.shard(model, device=device, world=ctx.world, bf16=bf16) if sharded else model.to(device)

    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
    model = load_model(spec.model_dir)
    if activation_checkpointing:
        fsdp.checkpoint_activations(model)
    if spec.lora.enabled:  # the base frozen, one adapter trained (learner/lora.py)
        model = lora.wrap(model, spec.lora)
    model = place(model)
    reference = None
    if spec.loss.kl_beta > 0:  # a LoRA job's reference is its own base: the adapter disabled, no second model
        reference = lora.AdapterOff(model) if spec.lora.enabled else place(
            load_model(spec.model_dir).eval().requires_grad_(False))
    optimizer = torch.optim.AdamW(lora.trainable(model), lr=spec.learning_rate)
    trainer = PolicyTrainer(model, optimizer, spec.loss, pad_id=tokenizer.pad_token_id, reference=reference,
                            micro_batch=micro_batch, bf16=bf16, ctx=ctx, max_grad_norm=spec.loss.max_grad_norm)
    return trainer, tokenizer

"""Run by test_fsdp.py: the policy built as the learner builds it (``build_policy``), two updates, and its
checkpoints written and loaded as :class:`learner.loop.LearnerLoop` writes and loads them.

Modes (``--mode``):

- ``reference`` (one process): step(A), checkpoint (a whole one, format 1) into ``<out>/whole``, step(B);
  saves the published weights (``full_state``) to ``<out>/reference.pt``.
- ``fsdp`` (torchrun, ``--parallel fsdp``): step(A), a sharded checkpoint into ``<out>/sharded``, step(B),
  weights -> ``continued``; then load the reference's whole checkpoint (a single-process checkpoint into
  sharded ranks) and step(B) again -> ``from_whole``; both in ``<out>/fsdp.pt``.
- ``resume`` (one process): load the 2-rank sharded checkpoint, step(B) -> ``<out>/resumed.pt``.
- ``bf16`` (torchrun, FSDP mixed precision): step(A), step(B), a sharded checkpoint; losses, gradient norms and
  weights -> ``<out>/bf16.pt``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

from dataplane.jobs import JobSpec
from learner import distributed
from learner.checkpoint import Checkpoint, CheckpointStore
from learner.policy import build_policy
from learner.step import PolicyTrainer

from .ddp_step import batches


def checkpoint(trainer: PolicyTrainer, root: Path, version: int) -> None:
    """What ``LearnerLoop.write_checkpoint`` does with the trainer."""
    store = CheckpointStore(root)
    store.save(Checkpoint(version=version, **trainer.checkpoint_state(store, version), rng={}, trained_entry_ids=[],
                          job={}))


def resume(trainer: PolicyTrainer, root: Path) -> None:
    """What ``LearnerLoop.resume`` does with the trainer."""
    store = CheckpointStore(root)
    ckpt = store.load()
    trainer.load_state(ckpt.model, ckpt.optimizer, sharded=store.sharded_path(ckpt))


def weights(trainer: PolicyTrainer) -> dict[str, torch.Tensor]:
    return dict(trainer.full_state())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out", type=Path)
    parser.add_argument("--mode", choices=["reference", "fsdp", "resume", "bf16"], required=True)
    parser.add_argument("--micro-batch", type=int, default=None)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--lora", type=int, default=0, help="A LoRA job of this rank (0: the whole model).")
    args = parser.parse_args()
    torch.set_num_threads(1)

    ctx = distributed.init(args.device, timeout_s=120)
    # AdamW (two moments to shard and checkpoint), a KL term (a sharded reference model), clipping (the norm of
    # sharded gradients)
    spec = JobSpec(name="fsdp", model_dir=args.model_dir, task={"name": "arithmetic"}, batch_trajectories=9,
                   group_size=3, learning_rate=1e-2, loss={"kl_beta": 0.1, "max_grad_norm": 0.5},
                   lora={"rank": args.lora})
    trainer, tokenizer = build_policy(spec, device=ctx.device, ctx=ctx, micro_batch=args.micro_batch,
                                      bf16=args.mode == "bf16", parallel="ddp" if args.mode == "reference" else "fsdp",
                                      activation_checkpointing=args.activation_checkpointing)
    if not ctx.is_main:
        trainer.serve()
        distributed.shutdown(ctx)
        return
    a, b = batches(tokenizer)
    if args.mode == "reference":
        trainer.step(a)
        checkpoint(trainer, args.out / "whole", 1)
        trainer.step(b)
        torch.save(weights(trainer), args.out / "reference.pt")
    elif args.mode == "fsdp":
        trainer.step(a)
        checkpoint(trainer, args.out / "sharded", 1)
        trainer.step(b)
        continued = weights(trainer)
        resume(trainer, args.out / "whole")
        trainer.step(b)
        torch.save({"continued": continued, "from_whole": weights(trainer), "ranks": ctx.world,
                    "sharded": trainer.sharded}, args.out / "fsdp.pt")
    elif args.mode == "resume":
        resume(trainer, args.out / "sharded")
        trainer.step(b)
        torch.save(weights(trainer), args.out / "resumed.pt")
    else:
        results = [trainer.step(batch) for batch in (a, b)]
        checkpoint(trainer, args.out / "bf16-sharded", 2)
        torch.save({"losses": [r.loss for r in results], "grad_norms": [r.grad_norm for r in results],
                    "weights": weights(trainer)}, args.out / "bf16.pt")
    trainer.release()
    distributed.shutdown(ctx)


if __name__ == "__main__":
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    main()
    # Everything is saved and the group shut down. gloo's threads can still abort the process while C++ statics are
    # torn down at interpreter exit ("terminate called without an active exception", seen under load), which torchrun
    # reports as a failed rank: leave now, as learner/cli.py does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

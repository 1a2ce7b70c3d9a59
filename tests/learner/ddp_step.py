"""Run by test_distributed.py under ``torchrun`` (or alone, for the single-process reference).

Every rank builds the tiny policy; rank 0 drives three updates through :class:`PolicyTrainer` exactly
as the learner does: step(A), step(B), then load_state(the state after A) and step(B) again, so the
reload must reach every rank (parameters and optimizer state) for the ranks to stay identical. Each
rank saves its final parameters to ``<out>/rank<r>.pt``. Alone (``--reference``) it does step(A),
step(B) on one process and saves ``<out>/single.pt``.
"""

from __future__ import annotations

import argparse
import copy
import os
import sys
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from dataplane.jobs import LossConfig
from dataplane.records import Trajectory
from learner import distributed
from learner.step import PolicyTrainer


def group(tokenizer, group_id: str, prompt: str, answers: dict[str, float], logprob: float) -> list[Trajectory]:
    prompt_ids = [tokenizer.bos_token_id, *tokenizer(prompt, add_special_tokens=False)["input_ids"]]
    return [
        Trajectory(job_id=1, lease_id=f"lease-{group_id}", group_id=group_id, prompt=prompt, prompt_ids=prompt_ids,
                   completion=answer,
                   completion_ids=[*tokenizer(answer, add_special_tokens=False)["input_ids"], tokenizer.eos_token_id],
                   logprobs=[logprob] * (len(answer) + 1), reward=reward, version=0)
        for answer, reward in answers.items()
    ]


def batches(tokenizer) -> tuple[list[Trajectory], list[Trajectory]]:
    # behaviour log-probs far from the policy's, so the ratios clip on some tokens and not others
    a = [*group(tokenizer, "a", "3+4=", {"7": 1.0, "55": 0.0, "1": 0.0}, -2.5),
         *group(tokenizer, "b", "2+2=", {"1": 0.0, "4": 1.0, "44": 1.0}, -3.0),
         *group(tokenizer, "c", "1+1=", {"2": 1.0, "3": 0.0, "222": 0.0}, -2.7)]
    b = [*group(tokenizer, "d", "4+4=", {"8": 1.0, "9": 0.0, "0": 0.0}, -2.8),
         *group(tokenizer, "e", "0+3=", {"3": 1.0, "33": 0.0, "2": 1.0}, -2.6)]
    return a, b


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model_dir")
    parser.add_argument("out", type=Path)
    parser.add_argument("--reference", action="store_true")
    parser.add_argument("--micro-batch", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    ctx = distributed.init("cpu", timeout_s=120)
    tokenizer = AutoTokenizer.from_pretrained(args.model_dir)
    model = AutoModelForCausalLM.from_pretrained(args.model_dir)
    # SGD with momentum: the momentum buffer is optimizer state that a reload must restore on every rank
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loss = LossConfig(clip_eps_low=0.2, clip_eps_high=0.28).resolved(clip_eps=0.2, max_new_tokens=1)
    trainer = PolicyTrainer(model, optimizer, loss, pad_id=tokenizer.pad_token_id, micro_batch=args.micro_batch,
                            ctx=ctx)
    a, b = batches(tokenizer)
    if args.reference:
        trainer.step(a)
        trainer.step(b)
        torch.save({k: v.detach() for k, v in model.state_dict().items()}, args.out / "single.pt")
        return
    if ctx.is_main:
        trainer.step(a)
        after_a = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()))
        trainer.step(b)
        trainer.load_state(*after_a)
        trainer.step(b)
        trainer.release()
    else:
        trainer.serve()
    torch.save({k: v.detach() for k, v in model.state_dict().items()}, args.out / f"rank{ctx.rank}.pt")
    distributed.shutdown(ctx)


if __name__ == "__main__":
    main()
    # Everything is saved and the group shut down. gloo's threads can still abort the process while C++ statics are
    # torn down at interpreter exit ("terminate called without an active exception", seen under load), which torchrun
    # reports as a failed rank: leave now, as learner/cli.py does.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)

"""Learner step throughput: tokens per second of one GRPO update, against a plain torch loop on the same batch.

Run: ``.venv/bin/python bench/bench_learner.py [--groups 16] [--n 8] [--completion 8] [--repeats 10] [--threads 1]``

The learner's step (:meth:`learner.step.PolicyTrainer.step`) collates the records, computes group
advantages and the configured loss with its statistics, and takes an AdamW update. The reference is the
least a GRPO update must do: the same pre-collated tensors, one forward, a token-mean PPO-clip loss,
backward, AdamW. Tokens are all sequence positions the forward pass processes (prompt + completion);
the ratio is the learner's time over the plain loop's (1.00 = no overhead). Medians of ``--repeats``
timed updates after two warm-up updates, on the tiny Llama model (hidden 64, 2 layers) on the CPU.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.jobs import LossConfig  # noqa: E402
from dataplane.records import Trajectory  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from learner.batch import collate  # noqa: E402
from learner.grpo import group_advantages  # noqa: E402
from learner.step import PolicyTrainer  # noqa: E402
from learner.tiny import build_tiny_model  # noqa: E402

VARIANTS = {
    "grpo (default)": {},
    "grpo + tis": {"off_policy": "tis"},
    "gspo": {"type": "gspo", "aggregation": "seq-mean-token-mean"},
    "grpo + kl (reference forward)": {"kl_beta": 0.05},
    "grpo, micro-batch 32": {"micro_batch": 32},
}


def make_records(vocab: int, *, groups: int, n: int, completion: int, seed: int) -> list[Trajectory]:
    rng = random.Random(seed)
    records = []
    for g in range(groups):
        prompt = [1, *(rng.randrange(3, vocab) for _ in range(rng.randint(4, 6)))]
        for _ in range(n):
            length = rng.randint(max(1, completion // 2), completion)
            records.append(Trajectory(
                job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt="p", prompt_ids=prompt, completion="c",
                completion_ids=[rng.randrange(3, vocab) for _ in range(length)],
                logprobs=[-rng.uniform(0.5, 3.0) for _ in range(length)], reward=float(rng.random() < 0.4),
                version=0))
    return records


def plain_step(model, optimizer, batch, advantages) -> None:
    """The reference: forward, token-mean PPO-clip against the behaviour log-probs, backward, AdamW."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention).logits[:, :-1, :].float()
    logp = torch.log_softmax(logits, dim=-1).gather(2, batch.input_ids[:, 1:, None]).squeeze(2)
    ratio = torch.exp(logp - batch.behaviour_logp)
    adv = advantages[:, None]
    surrogate = torch.minimum(ratio * adv, ratio.clamp(0.8, 1.2) * adv)
    loss = -(surrogate * batch.token_mask).sum() / batch.token_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()


def timed(fns: dict[str, object], repeats: int) -> dict[str, float]:
    """Median seconds per call of each function, timed round-robin so a busy neighbour slows them all alike."""
    for fn in fns.values():
        for _ in range(2):
            fn()
    samples: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            started = time.perf_counter()
            fn()
            samples[name].append(time.perf_counter() - started)
    return {name: statistics.median(values) for name, values in samples.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--groups", type=int, default=16)
    parser.add_argument("--n", type=int, default=8)
    parser.add_argument("--completion", type=int, default=8, help="longest completion, in tokens")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    console = Console()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", alphabet=build_task({"name": "arithmetic"}).alphabet)
        load = lambda: AutoModelForCausalLM.from_pretrained(model_dir)  # noqa: E731
        vocab = load().config.vocab_size
        records = make_records(vocab, groups=args.groups, n=args.n, completion=args.completion, seed=0)
        batch = collate(records, pad_id=0)
        tokens = int(batch.attention.sum())

        model = load()
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        advantages = group_advantages(batch.rewards, batch.group_index)
        fns = {"plain": lambda: plain_step(model, optimizer, batch, advantages)}
        for name, overrides in VARIANTS.items():
            overrides = dict(overrides)
            micro_batch = overrides.pop("micro_batch", None)
            settings = LossConfig(**overrides).resolved(clip_eps=0.2, max_new_tokens=args.completion)
            policy = load()
            reference = load().eval().requires_grad_(False) if settings.kl_beta > 0 else None
            # every row, as the plain loop trains them (a group of equal rewards would otherwise be skipped)
            trainer = PolicyTrainer(policy, torch.optim.AdamW(policy.parameters(), lr=1e-4), settings, pad_id=0,
                                    reference=reference, micro_batch=micro_batch, skip_idle_rows=False)
            fns[name] = lambda t=trainer: t.step(records)
        medians = timed(fns, args.repeats)
        plain = medians.pop("plain")
        rows = list(medians.items())

    table = Table(title=f"one update: R={len(records)} sequences, {tokens} tokens, "
                        f"{args.threads} CPU thread(s), median of {args.repeats}")
    table.add_column("step")
    table.add_column("ms", justify="right")
    table.add_column("tokens/s", justify="right")
    table.add_column("vs plain loop", justify="right")
    table.add_row("plain torch loop (reference)", f"{plain * 1e3:.1f}", f"{tokens / plain:,.0f}", "1.00")
    for name, seconds in rows:
        table.add_row(f"learner: {name}", f"{seconds * 1e3:.1f}", f"{tokens / seconds:,.0f}", f"{seconds / plain:.2f}")
    console.print(table)
    console.print(f"learner overhead (default step / plain loop): {rows[0][1] / plain:.2f}x")


if __name__ == "__main__":
    main()

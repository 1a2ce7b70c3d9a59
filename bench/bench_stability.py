"""GRPO stability on the demo's configuration: how many updates until the 10-step mean reward reaches the
target, per seed, with and without clipping the gradient's global norm (``loss.max_grad_norm``).

Run: ``.venv/bin/python bench/bench_stability.py [--seeds 1 2 3 4 5 6 7 8] [--clip none 1.0] [--max-steps 1000]
[--jobs 2]`` (about 15 minutes on 2 cores with the defaults).

In-process, no site or Redis, the ``make demo`` job: the tiny model (hidden 64, 2 layers, init seed 0),
arithmetic with operands 0..4, R = 128 (16 groups of n = 8), AdamW lr 1e-3, two new tokens, S = 3 with
each group sampled under a policy 0..2 versions old (the admissible window the demo's pool fills), the
learner's own :class:`learner.step.PolicyTrainer` taking the update. The seed drives sampling and prompt
order. A run that has not reached the target after ``--max-steps`` counts as failed; "max |g|" is the
largest gradient norm seen before clipping, and the spikes it shows (tens of times the median) are what
collapse a policy this small into one constant answer.
"""

from __future__ import annotations

import argparse
import collections
import random
import statistics
import sys
import tempfile
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.append(str(Path(__file__).resolve().parent))  # bench/bench_staleness.py (bench_* names shadow no package)

TASK = {"name": "arithmetic", "max_operand": 4}
GROUPS, N, LR, MAX_NEW, LAGS, TARGET = 16, 8, 1e-3, 2, 3, 0.8


def run(model_dir: str, seed: int, clip: float | None, max_steps: int) -> tuple[int | None, float, float, float]:
    """Train until the 10-step mean reward reaches TARGET; returns (steps or None, final 10-step mean,
    max grad norm, median grad norm)."""
    import torch
    from bench_staleness import snapshot, stale_batch  # the same simulated pool as bench/bench_staleness.py
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    from dataplane.jobs import LossConfig
    from dataplane.tasks import build_task
    from learner.step import PolicyTrainer
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    task = build_task(TASK)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(model_dir, device="cpu", seed=seed)
    loss = LossConfig().resolved(clip_eps=0.2, max_new_tokens=MAX_NEW)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=LR), loss,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=clip)

    history = collections.deque([snapshot(model)], maxlen=LAGS)  # history[-1 - lag]: the policy lag updates ago
    rng = random.Random(seed)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    rewards: collections.deque[float] = collections.deque(maxlen=10)
    norms = []
    for t in range(1, max_steps + 1):
        result = trainer.step(stale_batch(engine, task, history, rng, t=t, groups=GROUPS, n=N, params=params))
        rewards.append(result.reward_mean)
        norms.append(result.grad_norm)
        history.append(snapshot(model))
        if len(rewards) == 10 and statistics.fmean(rewards) >= TARGET:
            return t, statistics.fmean(rewards), max(norms), statistics.median(norms)
    return None, statistics.fmean(rewards), max(norms), statistics.median(norms)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 7, 8])
    parser.add_argument("--clip", nargs="+", default=["none", "1.0"], help="max_grad_norm values; 'none' = off")
    parser.add_argument("--max-steps", type=int, default=1000)
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel (one CPU thread each)")
    args = parser.parse_args()
    from dataplane.tasks import build_task
    from learner.tiny import build_tiny_model

    console = Console()
    clips = [None if c == "none" else float(c) for c in args.clip]
    console.print(f"[dim]demo job in-process: R={GROUPS * N}, lr {LR}, lags 0..{LAGS - 1}, target 10-step mean "
                  f"{TARGET}, at most {args.max_steps} updates; {len(args.seeds)} seeds x {len(clips)} settings[/dim]")
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", alphabet=build_task(TASK).alphabet, seed=0))
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = {(clip, seed): pool.submit(run, model_dir, seed, clip, args.max_steps)
                       for clip in clips for seed in args.seeds}
            results = {key: future.result() for key, future in futures.items()}

    table = Table(title="steps until the 10-step mean reward reaches 0.8 (demo job)")
    table.add_column("seed", justify="right")
    for clip in clips:
        table.add_column(f"steps, clip {clip}", justify="right")
        table.add_column("|g| max/med", justify="right")
    for seed in args.seeds:
        row = [str(seed)]
        for clip in clips:
            steps, final, top, median = results[(clip, seed)]
            row += [str(steps) if steps else f"[red]no[/red] ({final:.2f})", f"{top:.1f}/{median:.2f}"]
        table.add_row(*row)
    console.print(table)
    for clip in clips:
        done = [results[(clip, s)][0] for s in args.seeds if results[(clip, s)][0]]
        median = statistics.median(done) if done else float("nan")
        console.print(f"max_grad_norm={clip}: {len(done)}/{len(args.seeds)} reached the target within "
                      f"{args.max_steps} updates; median {median:.0f} updates among those")


if __name__ == "__main__":
    main()

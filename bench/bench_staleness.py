"""Staleness sweep: GRPO on the arithmetic task with the tiny model, records lagging by up to S versions.

Run: ``.venv/bin/python bench/bench_staleness.py [--staleness 1 3 6 11] [--corrections none behaviour tis]
[--steps 150] [--png var/bench/staleness.png]``

In-process, no site or Redis: a simulated rollout pool samples every prompt group under a snapshot of
the policy ``lag`` updates old, ``lag`` drawn uniformly from ``0..min(S, t)`` per group (the admissible
window ``v >= v_t - S`` of paper section 3.2, filled evenly), with ``worker_agent.engines.hf.HFEngine``
loading that snapshot; the learner's own :class:`learner.step.PolicyTrainer` takes the update. Each
S runs once per off-policy correction (``LossConfig.off_policy``): ``none`` (stale records treated as
on-policy), ``behaviour`` (the default: PPO ratio against the behaviour log-probs, clipped), ``tis``
(decoupled ratio, behaviour weight truncated at C = 2). The final reward is the mean reward of the
final policy on 4 samples of each of the task's 25 prompts. One seed: differences of a few points are
noise; the point is the trend with S. The reward curves go to a PNG when matplotlib is installed.
"""

from __future__ import annotations

import argparse
import collections
import random
import sys
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.jobs import LossConfig  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from learner.step import PolicyTrainer  # noqa: E402
from learner.tiny import build_tiny_model  # noqa: E402
from worker_agent.engines.base import SamplingParams  # noqa: E402
from worker_agent.engines.hf import HFEngine  # noqa: E402
from worker_agent.rollout import GroupLease, rollout_groups  # noqa: E402

TASK = {"name": "arithmetic", "max_operand": 4}
GROUPS, N, LR, MAX_NEW = 8, 8, 3e-3, 2  # R = 64 trajectories per update


def run(model_dir: Path, *, staleness: int, correction: str, steps: int, seed: int) -> tuple[list[float], float]:
    """Train ``steps`` updates; returns (batch reward per step, final-policy reward)."""
    from transformers import AutoModelForCausalLM

    task = build_task(TASK)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(str(model_dir), device="cpu", seed=seed)
    settings = LossConfig(off_policy=correction, is_cap=2.0).resolved(clip_eps=0.2, max_new_tokens=MAX_NEW)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=LR), settings,
                            pad_id=engine.tokenizer.pad_token_id)
    history = collections.deque([snapshot(model)], maxlen=staleness + 1)  # history[-1 - lag]: v_t - lag
    rng = random.Random(seed)
    params = SamplingParams(max_new_tokens=MAX_NEW)
    rewards = []
    for t in range(steps):
        records = stale_batch(engine, task, history, rng, t=t, groups=GROUPS, n=N, params=params)
        rewards.append(trainer.step(records).reward_mean)
        history.append(snapshot(model))
    return rewards, _evaluate(engine, task, history[-1], params)


def stale_batch(engine: HFEngine, task, history, rng: random.Random, *, t: int, groups: int, n: int,
                params: SamplingParams) -> list:
    """One update's records from a simulated pool: ``groups`` prompt groups of ``n``, each sampled under a
    policy ``lag`` updates old (``history[-1 - lag]``, lag uniform over what ``history`` holds)."""
    by_lag: dict[int, list[str]] = collections.defaultdict(list)
    for prompt in task.sample_prompts(rng, groups):
        by_lag[rng.randint(0, len(history) - 1)].append(prompt.text)
    records = []
    for lag, prompts in sorted(by_lag.items()):
        engine.load_weights(history[-1 - lag])
        leases = [GroupLease(f"{t}-{lag}-{i}", f"{t}-{lag}-{i}", p) for i, p in enumerate(prompts)]
        for group in rollout_groups(engine, task, leases, job_id=1, n=n, params=params, version=t - lag):
            records.extend(group.records)
    return records


def snapshot(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _evaluate(engine: HFEngine, task, weights: dict, params: SamplingParams) -> float:
    engine.load_weights(weights)
    prompts = [f"{a}+{b}=" for a in range(task.max_operand + 1) for b in range(task.max_operand + 1)]
    groups = engine.generate(prompts, n=4, params=params)
    scores = [task.reward(p, c.text) for p, group in zip(prompts, groups, strict=True) for c in group]
    return sum(scores) / len(scores)


def smooth(values: list[float], window: int = 10) -> list[float]:
    return [sum(values[max(0, i - window + 1): i + 1]) / len(values[max(0, i - window + 1): i + 1])
            for i in range(len(values))]


def save_png(path: Path, curves: dict[tuple[int, str], list[float]], corrections: list[str]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(corrections), figsize=(5 * len(corrections), 4), sharey=True, squeeze=False)
    for ax, correction in zip(axes[0], corrections, strict=True):
        for (s, c), values in sorted(curves.items()):
            if c == correction:
                ax.plot(range(1, len(values) + 1), smooth(values), label=f"S={s}")
        ax.set_title(f"off_policy={correction}")
        ax.set_xlabel("learner step")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("batch reward (10-step mean)")
    axes[0][-1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--staleness", type=int, nargs="+", default=[1, 3, 6, 11])
    parser.add_argument("--corrections", nargs="+", default=["none", "behaviour", "tis"],
                        choices=["none", "behaviour", "tis", "mis"])
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--png", type=Path, default=Path("var/bench/staleness.png"))
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    console = Console()
    console.print(f"[dim]note: {args.steps} updates of R={GROUPS * N} per run, tiny model (hidden 64, 2 layers), "
                  f"lr {LR}, one seed; a small CPU-sized sweep, so expect noise of a few points[/dim]")

    curves: dict[tuple[int, str], list[float]] = {}
    finals: dict[tuple[int, str], float] = {}
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "tiny", alphabet=build_task(TASK).alphabet, seed=args.seed)
        for s in args.staleness:
            for correction in args.corrections:
                started = time.perf_counter()
                curves[(s, correction)], finals[(s, correction)] = run(model_dir, staleness=s, correction=correction,
                                                                       steps=args.steps, seed=args.seed)
                console.print(f"S={s:<3} {correction:<9} final reward {finals[(s, correction)]:.3f} "
                              f"({time.perf_counter() - started:.1f}s)")

    table = Table(title="final-policy reward (mean of 100 samples), by staleness budget S and correction")
    table.add_column("S", justify="right")
    for correction in args.corrections:
        table.add_column(correction, justify="right")
    table.add_column("last-10 batch reward (" + "/".join(args.corrections) + ")", justify="right")
    for s in args.staleness:
        table.add_row(str(s), *(f"{finals[(s, c)]:.3f}" for c in args.corrections),
                      " / ".join(f"{sum(curves[(s, c)][-10:]) / 10:.3f}" for c in args.corrections))
    console.print(table)
    if save_png(args.png, curves, args.corrections):
        console.print(f"reward curves: {args.png}")
    else:
        console.print("[yellow]matplotlib is not installed: no PNG (pip install matplotlib)[/yellow]")


if __name__ == "__main__":
    main()

"""Learning quality under staleness (paper Figure 3b / 6 on our task): GRPO through the learner's own update,
fed by a simulated pool whose records lag by up to S versions, over seeds.

Run: ``.venv/bin/python bench/bench_staleness.py --full [--jobs 2] [--png docs/paper/staleness.png] [--json PATH]``
for the sweep of issue 17 (8 seeds x S in {2, 3, 6, 11} x corrections none and tis, 250 updates each: about an
hour on 2 free cores). Without ``--full`` (what ``make bench`` runs): 2 seeds, S in {2, 11}, 150 updates, a few
minutes. ``--staleness``, ``--corrections``, ``--seeds``, ``--steps`` override either.

The job is ``make demo``'s (the tiny model, arithmetic with operands 0..4, R = 128 as 16 groups of n = 8,
AdamW lr 1e-3, two new tokens, ``max_grad_norm`` 1.0), trained in-process by
:class:`learner.step.PolicyTrainer`. The pool: the learner publishes a snapshot every kappa = S - 1 updates
(paper 3.2); each prompt group of update t + 1 is sampled (``worker_agent.engines.hf.HFEngine``) under a
version drawn uniformly from the published versions the staleness gate admits (v >= t - S): a fleet whose
workers hold a spread of the versions they may still use, the most stale allowed included. Corrections
(``LossConfig.off_policy``): ``none`` (stale records treated as on-policy), ``tis`` (decoupled ratio with the
behaviour weight truncated at C = 2), ``behaviour`` (the learner's default: PPO ratio against the behaviour
log-probs). Per run: the first update at which the 10-update mean batch reward reaches 0.8 (censored at
``--steps``), and the final policy's reward on 4 samples of each of the task's 25 prompts after ``--steps``.
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import random
import statistics
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
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
GROUPS, N, LR, MAX_NEW, CLIP, TARGET, WINDOW = 16, 8, 1e-3, 2, 1.0, 0.8, 10  # the make demo job


def run(model_dir: str, *, staleness: int, kappa: int, correction: str, steps: int, seed: int) -> dict:
    """Train ``steps`` updates under the simulated stale pool; the run's batch rewards, first update at TARGET
    (10-update mean; None if never) and final-policy reward."""
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    torch.set_num_threads(1)
    task = build_task(TASK)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    engine = HFEngine(model_dir, device="cpu", seed=seed)
    settings = LossConfig(off_policy=correction, is_cap=2.0).resolved(clip_eps=0.2, max_new_tokens=MAX_NEW)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=LR), settings,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=CLIP)
    published = {0: snapshot(model)}  # version -> weights, the ones the gate still admits
    rng, params = random.Random(seed), SamplingParams(max_new_tokens=MAX_NEW)
    rewards, lags, reached, started = [], [], None, time.perf_counter()
    for t in range(steps):  # the policy is version t; this update makes t + 1
        records = pool_batch(engine, task, published, rng, t=t, groups=GROUPS, n=N, params=params)
        lags.extend(t - r.version for r in records)
        rewards.append(trainer.step(records).reward_mean)
        if reached is None and len(rewards) >= WINDOW and statistics.fmean(rewards[-WINDOW:]) >= TARGET:
            reached = t + 1
        if (t + 1) % kappa == 0:
            published[t + 1] = snapshot(model)
        published = {v: w for v, w in published.items() if v >= t + 1 - staleness}
    return {"staleness": staleness, "kappa": kappa, "correction": correction, "seed": seed, "rewards": rewards,
            "reached": reached, "final": _evaluate(engine, task, snapshot(model), params),
            "mean_lag": statistics.fmean(lags), "max_lag": max(lags), "seconds": time.perf_counter() - started}


def pool_batch(engine: HFEngine, task, published: dict[int, dict], rng: random.Random, *, t: int, groups: int,
               n: int, params: SamplingParams) -> list:
    """``groups`` prompt groups of ``n`` for update t + 1, each sampled under a version drawn uniformly from
    ``published`` (every one admissible: ``v >= t - S``)."""
    by_version: dict[int, list[str]] = collections.defaultdict(list)
    versions = sorted(published)
    for prompt in task.sample_prompts(rng, groups):
        by_version[rng.choice(versions)].append(prompt.text)
    records = []
    for version, prompts in sorted(by_version.items()):
        engine.load_weights(published[version])
        leases = [GroupLease(f"{t}-{version}-{i}", f"{t}-{version}-{i}", p) for i, p in enumerate(prompts)]
        for group in rollout_groups(engine, task, leases, job_id=1, n=n, params=params, version=version):
            records.extend(group.records)
    return records


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


def mean_std(values: list[float]) -> tuple[float, float]:
    return (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0) if values else \
        (math.nan, math.nan)


def summarise(results: list[dict], steps: int) -> dict[tuple[int, str], dict]:
    """Per (S, correction): seeds reaching the target, updates to it (mean, std over those that did, and the
    censored mean counting a miss as ``steps``), final reward (mean, std), mean lag."""
    out = {}
    for key in sorted({(r["staleness"], r["correction"]) for r in results}):
        runs = [r for r in results if (r["staleness"], r["correction"]) == key]
        hit = [r["reached"] for r in runs if r["reached"] is not None]
        out[key] = {"seeds": len(runs), "reached": len(hit), "to_target": mean_std(hit),
                    "censored": statistics.fmean([r["reached"] or steps for r in runs]),
                    "final": mean_std([r["final"] for r in runs]),
                    "mean_lag": statistics.fmean(r["mean_lag"] for r in runs), "kappa": runs[0]["kappa"]}
    return out


def report(console: Console, summary: dict, corrections: list[str], budgets: list[int], steps: int) -> None:
    table = Table(title=f"GRPO under staleness: updates until the {WINDOW}-update mean reward reaches {TARGET} "
                        f"(of {steps}), final-policy reward; mean ± std over seeds")
    for name in ("S", "kappa", "correction", "mean lag", "reached", "updates to 0.8", "vs S=2",
                 "censored mean", "final reward"):
        table.add_column(name, justify="left" if name == "correction" else "right")
    for correction in corrections:
        base = summary.get((min(budgets), correction))
        for s in budgets:
            row = summary[(s, correction)]
            mean, std = row["to_target"]
            rel = "-" if base is None or s == min(budgets) or not (row["reached"] or base["reached"]) else \
                f"{100 * (row['censored'] / base['censored'] - 1):+.0f}%"
            table.add_row(str(s), str(row["kappa"]), correction, f"{row['mean_lag']:.2f}",
                          f"{row['reached']}/{row['seeds']}", "-" if math.isnan(mean) else f"{mean:.0f} ± {std:.0f}",
                          rel, f"{row['censored']:.0f}", "{:.3f} ± {:.3f}".format(*row["final"]))
    console.print(table)
    console.print("[dim]vs S=2: censored mean updates to 0.8 (a seed that never got there counts as "
                  f"{steps}) against the smallest budget's, same correction; the paper's claim to check: S = 3 "
                  "within 5% of S = 2.[/dim]")


def save_png(path: Path, results: list[dict], corrections: list[str], budgets: list[int]) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    fig, axes = plt.subplots(1, len(corrections), figsize=(5.5 * len(corrections), 4), sharey=True, squeeze=False)
    for ax, correction in zip(axes[0], corrections, strict=True):
        for s in budgets:
            curves = [smooth(r["rewards"]) for r in results if (r["staleness"], r["correction"]) == (s, correction)]
            if not curves:
                continue
            mean = [statistics.fmean(c[i] for c in curves) for i in range(len(curves[0]))]
            std = [statistics.pstdev(c[i] for c in curves) for i in range(len(curves[0]))]
            x = range(1, len(mean) + 1)
            ax.plot(x, mean, label=f"S={s}")
            ax.fill_between(x, [m - d for m, d in zip(mean, std, strict=True)],
                            [m + d for m, d in zip(mean, std, strict=True)], alpha=0.15)
        ax.axhline(TARGET, color="grey", lw=0.8, ls="--")
        ax.set_title(f"off_policy={correction} ({len(curves)} seeds, mean ± std)")
        ax.set_xlabel("learner update")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel(f"batch reward ({WINDOW}-update mean)")
    axes[0][-1].legend()
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    return True


def smooth(values: list[float], window: int = WINDOW) -> list[float]:
    return [statistics.fmean(values[max(0, i - window + 1): i + 1]) for i in range(len(values))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help="issue 17's sweep: 8 seeds, S in {2, 3, 6, 11}, "
                        "250 updates (default: 2 seeds, S in {2, 11}, 150 updates)")
    parser.add_argument("--staleness", type=int, nargs="+", help="budgets S (>= 2)")
    parser.add_argument("--corrections", nargs="+", default=["none", "tis"],
                        choices=["none", "behaviour", "tis", "mis"])
    parser.add_argument("--seeds", type=int, help="seeds per setting (1..N)")
    parser.add_argument("--steps", type=int, help="updates per run")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel, one CPU thread each")
    parser.add_argument("--png", type=Path, default=Path("var/bench/staleness.png"))
    parser.add_argument("--json", type=Path, help="write every run's rewards and the summary here")
    args = parser.parse_args()
    args.staleness = args.staleness or ([2, 3, 6, 11] if args.full else [2, 11])
    args.seeds = args.seeds or (8 if args.full else 2)
    args.steps = args.steps or (250 if args.full else 150)
    if min(args.staleness) < 2:
        parser.error("--staleness: every budget must be >= 2 (kappa = S - 1 >= 1)")
    console = Console() if sys.stdout.isatty() else Console(width=150)  # a log file gets the whole table
    settings = [(s, c, seed) for c in args.corrections for s in args.staleness for seed in range(1, args.seeds + 1)]
    console.print(f"[dim]{len(settings)} runs of {args.steps} updates (R={GROUPS * N}, lr {LR}, kappa = S - 1), "
                  f"{args.jobs} at a time[/dim]")
    results, started = [], time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = str(build_tiny_model(Path(tmp) / "tiny", alphabet=build_task(TASK).alphabet, seed=0))
        with ProcessPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run, model_dir, staleness=s, kappa=s - 1, correction=c, steps=args.steps,
                                   seed=seed) for s, c, seed in settings]
            for done, future in enumerate(as_completed(futures), 1):
                r = future.result()
                results.append(r)
                console.print(f"[dim]{done}/{len(settings)} S={r['staleness']} {r['correction']} seed {r['seed']}: "
                              f"0.8 at {r['reached'] or '-'}, final {r['final']:.3f} ({r['seconds']:.0f} s; "
                              f"{time.perf_counter() - started:.0f} s in)[/dim]")
    summary = summarise(results, args.steps)
    report(console, summary, args.corrections, sorted(args.staleness), args.steps)
    if save_png(args.png, results, args.corrections, sorted(args.staleness)):
        console.print(f"reward curves: {args.png}")
    else:
        console.print("[yellow]matplotlib is not installed: no PNG (pip install matplotlib)[/yellow]")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"runs": results, "summary": {f"S={s} {c}": v for (s, c), v in
                                                                     summary.items()}}, indent=1))


if __name__ == "__main__":
    main()

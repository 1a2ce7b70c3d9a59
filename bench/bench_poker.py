"""Heads-up hold'em through the data plane (docs/tasks.md "poker"): the share of legal actions and the big blinds
won per hand against each opponent, before and after a short GRPO training from a job file.

The same deals (prompts drawn from ``--eval-seed``) are played before and after, one hand per deal per opponent,
so the change is measured hand by hand (a paired difference: the cards' luck cancels). Training is the agent's
rollout (``rollout_groups`` on the HF engine) and the learner's update (``PolicyTrainer``) in one process, one
version per update, with the job file's settings, as tests/job_training.py does for the tiny models.

    .venv/bin/python bench/bench_poker.py --job examples/jobs/poker.toml --model var/models/smollm2-135m-instruct \\
        --hands 64 --steps 8

Prints a table (opponent, hands, legal answers of all decisions, bb/hand, before and after, the paired difference in
bb/hand with its standard error) and, with ``--json``, writes it. The change in legal answers is tested on each
deal's first decision, which reads the same message before and after (later ones depend on what was answered):
McNemar's exact test, i.e. a two-sided binomial test on the deals whose first answer changed legality.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.jobfiles import load_job_file  # noqa: E402
from dataplane.jobs import LossConfig, parse_job_spec  # noqa: E402
from dataplane.packed import pack_records  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from worker_agent.engines.base import SamplingParams  # noqa: E402
from worker_agent.rollout import GroupLease, rollout_groups  # noqa: E402

OPPONENTS = ("heuristic", "random", "self")


def play(engine, task, prompts: list[str], params: SamplingParams, batch: int) -> list[dict]:
    """One hand per prompt on ``engine``: each hand's return and its decisions and illegal answers."""
    rows = []
    for start in range(0, len(prompts), batch):
        leases = [GroupLease(f"e{i}", f"e{i}", p) for i, p in enumerate(prompts[start:start + batch], start)]
        for group in rollout_groups(engine, task, leases, job_id=1, n=1, params=params, version=0):
            record = group.records[0]
            rows.append({"bb": record.reward, "decisions": record.metadata["decisions"],
                         "illegal": record.metadata["illegal"]})
    return rows


def evaluate(engine, spec, hands: int, params: SamplingParams, batch: int, seed: int,
             opponents: list[str]) -> dict[str, list]:
    """``hands`` deals per opponent: the same seeds and seats for every opponent (the prompts differ where the
    opponent acts first), and the same before and after."""
    out = {}
    for opponent in opponents:
        task = build_task({**spec.task, "opponent": opponent})
        prompts = [p.text for p in task.sample_prompts(random.Random(seed), hands)]
        engine.generator.manual_seed(seed)  # the same draws before and after: only the policy differs
        started = time.perf_counter()
        out[opponent] = play(engine, task, prompts, params, batch)
        print(f"  {opponent}: {hands} hands in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return out


def train(engine, model, spec, task, steps: int, batch: int, micro_batch: int | None = None) -> list[float]:
    """``steps`` GRPO updates of ``model`` from the job's settings; each update's mean return (big blinds)."""
    import torch

    from learner.batch import concat
    from learner.step import PolicyTrainer

    settings = LossConfig().resolved(clip_eps=spec.clip_eps, max_new_tokens=spec.max_new_tokens)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=spec.learning_rate), settings,
                            pad_id=engine.tokenizer.pad_token_id, max_grad_norm=1.0, micro_batch=micro_batch)
    rng = random.Random(spec.seed)
    params = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature)
    means = []
    for t in range(steps):
        started = time.perf_counter()
        prompts = [p.text for p in task.sample_prompts(rng, spec.batch_trajectories // spec.group_size)]
        groups = []
        per_call = max(1, batch // spec.group_size)  # prompts per engine call: ``batch`` hands in lockstep
        for start in range(0, len(prompts), per_call):
            chunk = prompts[start:start + per_call]
            leases = [GroupLease(f"{t}-{i}", f"{t}-{i}", p) for i, p in enumerate(chunk, start)]
            groups += rollout_groups(engine, task, leases, job_id=1, n=spec.group_size, params=params, version=t)
        stats = trainer.step(concat(pack_records(g.records) for g in groups))
        means.append(stats.reward_mean)
        print(f"  step {t}: {len(groups)} groups, legal share {legal_share(groups):.3f}", file=sys.stderr)
        engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()})
        print(f"  step {t}: mean return {stats.reward_mean:+.3f} bb, {time.perf_counter() - started:.0f} s",
              file=sys.stderr)
    return means


def legal_share(groups) -> float:
    records = [r for g in groups for r in g.records]
    return 1 - sum(r.metadata["illegal"] for r in records) / max(1, sum(r.metadata["decisions"] for r in records))


def first_legal(row: dict) -> bool | None:
    """Whether the hand's first decision was legal (None: the agent never decided). An illegal answer folds, so it
    is always the hand's last decision: the first was illegal only in a hand of one decision with one illegal."""
    return None if not row["decisions"] else not (row["decisions"] == 1 and row["illegal"] == 1)


def mcnemar(before: list[dict], after: list[dict]) -> dict:
    """Paired by deal, on the first decision: ``worse`` deals legal before and not after, ``better`` the reverse;
    the exact two-sided p-value of as uneven a split under no change (each discordant deal a fair coin)."""
    pairs = [(first_legal(b), first_legal(a)) for b, a in zip(before, after, strict=True)]
    pairs = [(b, a) for b, a in pairs if b is not None and a is not None]
    worse = sum(b and not a for b, a in pairs)
    better = sum(a and not b for b, a in pairs)
    n = worse + better
    p = min(1.0, 2 * sum(math.comb(n, k) for k in range(min(worse, better) + 1)) / 2**n) if n else 1.0
    return {"deals": len(pairs), "legal_before": sum(b for b, _ in pairs), "legal_after": sum(a for _, a in pairs),
            "worse": worse, "better": better, "p": p}


def summary(rows: list[dict]) -> dict:
    decisions = sum(r["decisions"] for r in rows)
    legal = 1 - sum(r["illegal"] for r in rows) / max(1, decisions)
    bb = [r["bb"] for r in rows]
    return {"hands": len(rows), "decisions": decisions, "legal_answers": decisions - sum(r["illegal"] for r in rows),
            "legal": legal,
            "legal_se": math.sqrt(legal * (1 - legal) / max(1, decisions)),
            "bb": statistics.fmean(bb), "bb_se": statistics.stdev(bb) / math.sqrt(len(bb)) if len(bb) > 1 else 0.0}


def paired(before: list[dict], after: list[dict], key) -> tuple[float, float]:
    diffs = [key(b) - key(a) for a, b in zip(before, after, strict=True)]
    return statistics.fmean(diffs), statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else 0.0


def table(before: dict[str, list], after: dict[str, list] | None) -> list[dict]:
    rows = []
    for opponent, hands in before.items():
        row = {"opponent": opponent, "before": summary(hands)}
        if after is not None:
            row["after"] = summary(after[opponent])
            row["d_bb"], row["d_bb_se"] = paired(hands, after[opponent], lambda r: r["bb"])
            row["d_illegal"], row["d_illegal_se"] = paired(hands, after[opponent], lambda r: r["illegal"])
            row["first_decision"] = mcnemar(hands, after[opponent])
        rows.append(row)
    return rows


def show(rows: list[dict]) -> None:
    print("| opponent | hands | legal answers before | after | first decision legal, before -> after (p) | "
          "bb/hand before | after | paired change in bb/hand |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in rows:
        b, a, f = row["before"], row.get("after"), row.get("first_decision")
        share = "{legal_answers} of {decisions} ({legal:.3f})".format
        cells = [row["opponent"], str(b["hands"]), share(**b), share(**a) if a else "-",
                 f"{f['legal_before']} -> {f['legal_after']} of {f['deals']} (-{f['worse']} +{f['better']}, "
                 f"p = {f['p']:.2g})" if f else "-",
                 f"{b['bb']:+.2f} ± {b['bb_se']:.2f}", f"{a['bb']:+.2f} ± {a['bb_se']:.2f}" if a else "-",
                 f"{row['d_bb']:+.2f} ± {row['d_bb_se']:.2f}" if a else "-"]
        print("| " + " | ".join(cells) + " |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", default=str(ROOT / "examples" / "jobs" / "poker.toml"))
    parser.add_argument("--model", help="the model directory (default: the job file's model_dir)")
    parser.add_argument("--hands", type=int, default=64, help="deals played per opponent, before and after")
    parser.add_argument("--steps", type=int, default=8, help="GRPO updates between the two (0: before only)")
    parser.add_argument("--batch", type=int, default=32, help="hands played in lockstep per engine call")
    parser.add_argument("--eval-seed", type=int, default=12345)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's default)")
    parser.add_argument("--micro-batch", type=int, help="records per forward/backward of an update (memory)")
    parser.add_argument("--opponents", default=",".join(OPPONENTS), help="comma-separated, of " + ", ".join(OPPONENTS))
    parser.add_argument("--json", type=Path, help="write the table here")
    args = parser.parse_args(argv)

    import torch
    from transformers import AutoModelForCausalLM

    from worker_agent.engines.hf import HFEngine

    if args.threads:
        torch.set_num_threads(args.threads)
    spec = parse_job_spec(load_job_file(Path(args.job)))
    opponents = args.opponents.split(",")
    if not set(opponents) <= set(OPPONENTS):
        parser.error(f"--opponents: each of {', '.join(OPPONENTS)}")
    model_dir = args.model or spec.model_dir
    task = build_task(spec.task)
    torch.manual_seed(spec.seed)
    engine = HFEngine(model_dir, device="cpu", seed=spec.seed, prompt_format=spec.prompt_format)
    params = SamplingParams(max_new_tokens=spec.max_new_tokens, temperature=spec.temperature)
    print(f"before: {args.hands} hands per opponent, {model_dir}", file=sys.stderr)
    before = evaluate(engine, spec, args.hands, params, args.batch, args.eval_seed, opponents)
    after, curve = None, []
    show(table(before, None))  # printed now: a training that runs out of memory does not lose it
    if args.steps:
        model = AutoModelForCausalLM.from_pretrained(model_dir)
        engine.load_weights({k: v.detach().clone() for k, v in model.state_dict().items()})
        print(f"training: {args.steps} updates of {spec.batch_trajectories} hands", file=sys.stderr)
        curve = train(engine, model, spec, task, args.steps, args.batch, args.micro_batch)
        print("after:", file=sys.stderr)
        after = evaluate(engine, spec, args.hands, params, args.batch, args.eval_seed, opponents)
    rows = table(before, after)
    show(rows)
    if args.json:
        args.json.write_text(json.dumps({"job": args.job, "model": model_dir, "hands": args.hands,
                                         "steps": args.steps, "train_curve": curve, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Cost per step with flaky cheap workers: the site's short-window ``a_i`` alone against ``a_i`` weighed by the
long-run reliability ``r_i`` (marketplace/core/reliability.py), in the fleet simulator (simulator/).

The fleet: ``--steady`` RTX 5090s (0.35 USD/h, always there) and ``--flaky`` cheaper ones (``--flaky-price`` USD/h,
there half the time in spells of ``absence_s`` = 600 s on average), all at 0.28 trajectories/s, the paper's Qwen3-8B
learner (S = 3, R = 2048, T_train = 1631 s, 4 x A100 at 12.24 USD/h). The site's heartbeat window sees a flaky
worker that is there now as ``a_i = 1`` (``availability_seen="window"``), so by unit cost ``c_i / (a_i mu_i)`` it
takes the flaky ones first; with ``r_i`` (their week's record: about 500 departures in 84 connected hours, stay
0.68 over the 300 s horizon) their unit cost is above the steady ones'. Prints, per policy, the mean over seeds
of the cost per step (workers, learner, total), the step period, the bubble ratio and the flaky share of worker
time. Run: ``.venv/bin/python bench/bench_reliability.py [--seeds 3] [--steps 16]`` (about a minute).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from simulator import metrics  # noqa: E402
from simulator.activation import reliability_of  # noqa: E402
from simulator.fleet import simulate  # noqa: E402
from simulator.model import ControlSpec, WorkerSpec  # noqa: E402
from simulator.scenarios import BW, MU_5090, RTX5090, config  # noqa: E402

POLICIES = {"a_i alone (window)": False, "a_i x r_i (long run)": True}


def fleet(steady: int, flaky: int, flaky_price: float) -> list[WorkerSpec]:
    out = [WorkerSpec(i + 1, RTX5090, MU_5090, BW) for i in range(steady)]
    return out + [WorkerSpec(steady + i + 1, flaky_price, MU_5090, BW, availability=0.5) for i in range(flaky)]


def run(workers: list[WorkerSpec], *, use_r: bool, seed: int, steps: int, absence_s: float) -> dict:
    control = ControlSpec(availability_seen="window", reliability=use_r)
    cfg = replace(config(workers, 3, steps=steps, control=control, seed=seed), absence_s=absence_s)
    result = simulate(cfg)
    cost = metrics.cost_per_step(result)
    flaky = {w.worker_id for w in workers if w.availability < 1}
    return {"cost": cost, "bubble": metrics.bubble_ratio(result), "initial_flaky": len(set(result.initial_ids) & flaky),
            "initial": len(result.initial_ids)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steady", type=int, default=10)
    parser.add_argument("--flaky", type=int, default=10)
    parser.add_argument("--flaky-price", type=float, default=0.25)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--absence", type=float, default=600.0, help="Mean spell away of a flaky worker, s.")
    args = parser.parse_args()
    workers = fleet(args.steady, args.flaky, args.flaky_price)
    r_flaky = reliability_of(workers[-1], absence_s=args.absence)
    print(f"fleet: {args.steady} steady at ${RTX5090}/h, {args.flaky} flaky (a = 0.5) at ${args.flaky_price}/h, "
          f"mu = {MU_5090} traj/s each, away {args.absence:g} s at a time; r of a flaky worker = {r_flaky:.3f}; "
          f"{args.seeds} seeds x {args.steps} steps")
    print("| policy | initial pool (flaky) | USD/step workers | USD/step learner | USD/step total | step period (s) "
          "| bubble |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    totals = {}
    for name, use_r in POLICIES.items():
        runs = [run(workers, use_r=use_r, seed=seed, steps=args.steps, absence_s=args.absence)
                for seed in range(args.seeds)]
        mean = {key: statistics.fmean(r["cost"][key] for r in runs) for key in ("workers", "learner", "total",
                                                                                 "period")}
        totals[name] = mean["total"]
        print(f"| {name} | {runs[0]['initial']} ({runs[0]['initial_flaky']}) | {mean['workers']:.3f} | "
              f"{mean['learner']:.3f} | {mean['total']:.3f} | {mean['period']:.0f} | "
              f"{statistics.fmean(r['bubble'] for r in runs):.3f} |")
    base, ours = totals.values()
    print(f"total cost per step with r_i / without: {ours / base:.3f}")


if __name__ == "__main__":
    main()

"""The paper's systems results at the paper's own scale, from the fleet simulator (simulator/), each beside the
paper's figure: Figure 3c (bubble ratio vs pool size), Table 2 (ablations: no peer broadcast, no cost-aware
activation), Table 4 (single-worker faults at gamma 1.0 and 1.1), Figure 4 (T_bcast up to N = 1000) and a
Figure 3a-style cost comparison against an all-datacenter rollout pool. Parameters: simulator/scenarios.py.

Run: ``.venv/bin/python bench/paper.py [fig3c table2 table4 fig4 fig3a] [--quick] [--out docs/paper]``
(default: all sections, ~3 min on the 2-core machine; ``--quick`` runs fewer steps, sizes and seeds: ~15 s).
Each section prints a table and writes ``<out>/<section>.png``. Not a ``bench_*.py``: ``make bench`` does not run it.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from marketplace.core.provisioning import mu_min  # noqa: E402
from simulator import metrics, scenarios  # noqa: E402
from simulator.broadcast import closed_form, install_times, plan_for, t_bcast  # noqa: E402
from simulator.fleet import simulate  # noqa: E402
from simulator.model import MBIT, ControlSpec  # noqa: E402

PAPER_TABLE2 = {"Full": (9, 8.098, 1437, 0.0), "w/o P2P": (9, 8.432, 1830, 131.9),
                "w/o P2P (+1)": (10, 8.630, 1872, 84.1), "w/o Cost": (9, 9.339, 1437, 0.0)}
PAPER_TABLE4 = {"Broadcast: 1 forwarder slows 0.5x": (8.94, 312, 1.56),
                "Broadcast: 1 forwarder drops out": (16.45, 312, 2.63),
                "Rollout: 1 worker slows 0.5x": (6.80, 240, 0.97), "Rollout: 1 worker drops out": (12.50, 240, 1.88)}


def pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save(fig, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(out / f"{name}.png", dpi=110)
    print(f"figure: {out / name}.png")


def fig3c(quick: bool, out: Path) -> None:
    """Bubble ratio vs pool size for S = 3, 4, 6; the predicted threshold is mu_min / mu_5090."""
    steps, sizes = (12, range(3, 11)) if quick else (24, range(2, 13))
    print("Figure 3c: bubble ratio vs pool size (RTX 5090s, T_train 1631.2 s, B0 600 Mbit/s, chains)")
    print("paper: bubbles drop to ~0 near the threshold Eq. (2) predicts; larger S moves the drop left")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    for s in (3, 4, 6):
        bubbles = [metrics.bubble_ratio(simulate(scenarios.fig3c(s, n, steps=steps))) for n in sizes]
        t_b = closed_form("chain", 8, size=scenarios.SNAPSHOT_8B, bw=scenarios.BW, b0=scenarios.B0,
                          chunk=8 * 2**20)
        need = mu_min(kappa=s - 1, batch=scenarios.R_STEP, t_train=scenarios.T_TRAIN[3], t_bcast=t_b)
        threshold = need / scenarios.MU_5090
        print(f"  S={s}: predicted threshold {threshold:.2f} workers; bubble " +
              " ".join(f"N={n}:{b:.2f}" for n, b in zip(sizes, bubbles, strict=True)))
        line = ax.plot(list(sizes), bubbles, "o-", label=f"S={s}")[0]
        ax.axvline(threshold, color=line.get_color(), ls=":", alpha=0.7)
    keep = [metrics.bubble_ratio(simulate(scenarios.fig3c(3, n, steps=steps, generation="continue"))) for n in sizes]
    print("  S=3, workers keep generating under their old version while a snapshot travels (our agents): "
          + " ".join(f"N={n}:{b:.2f}" for n, b in zip(sizes, keep, strict=True)) + f" (R / (mu T_train) = "
          f"{scenarios.R_STEP / (scenarios.MU_5090 * scenarios.T_TRAIN[3]):.2f} workers)")
    ax.plot(list(sizes), keep, "x--", color="grey", label="S=3, keep generating")
    ax.set_xlabel("rollout pool size N (RTX 5090)")
    ax.set_ylabel("bubble ratio")
    ax.set_title("Figure 3c (simulated); dotted: Eq. (2) threshold")
    ax.legend()
    save(fig, out, "fig3c")


def table2_runs(quick: bool) -> dict[str, list[dict]]:
    """Full system, star broadcast with the same and one more machine, random and fastest-first activation."""
    steps, seeds = (10, 3) if quick else (20, 8)
    pool = scenarios.mixed_pool()
    full = simulate(scenarios.config(pool, steps=steps))
    ids = full.initial_ids
    spare = next(w.worker_id for w in sorted(pool, key=lambda w: w.price_per_hour / w.throughput)
                 if w.worker_id not in ids)
    runs = {"Full": [full],
            "w/o P2P": [simulate(scenarios.config(pool, steps=steps, strategy="star-limited",
                                                  control=scenarios.fixed(ids)))],
            "w/o P2P (+1)": [simulate(scenarios.config(pool, steps=steps, strategy="star-limited",
                                                       control=scenarios.fixed((*ids, spare))))],
            "w/o Cost (random)": [simulate(scenarios.config(pool, steps=steps, seed=k, control=ControlSpec(
                activation="random"))) for k in range(seeds)],
            "w/o Cost (fastest)": [simulate(scenarios.config(pool, steps=steps, control=ControlSpec(
                activation="fastest")))]}
    return {k: [row(r) for r in v] for k, v in runs.items()}


def row(result) -> dict:
    steps = metrics.counted(result, 2)
    bcast = list(result.t_bcast.values())
    return {"mach": len(result.initial_ids), "cost": metrics.cost_per_step(result)["total"],
            "t_bcast": statistics.median(bcast) if bcast else float("nan"),
            "wait": statistics.fmean(s.wait_s for s in steps), "bubble": metrics.bubble_ratio(result)}


def table2(quick: bool, out: Path) -> None:
    runs = table2_runs(quick)
    print("Table 2: ablations on a mixed-price pool (simulator/scenarios.py MIXED_POOL; cost = 4 x A100 learner "
          "+ active workers, USD/step)")
    print(f"  {'method':<20}{'#Mach':>6}{'Cost/step':>10}{'T_bcast':>9}{'Wait':>8}{'bubble':>8}   paper: #Mach, "
          "Cost/step, T_bcast, Wait")
    full_cost = runs["Full"][0]["cost"]
    for name, rows in runs.items():
        mean = {k: statistics.fmean(r[k] for r in rows) for k in rows[0]}
        paper = PAPER_TABLE2.get(name, PAPER_TABLE2["w/o Cost"] if name.startswith("w/o Cost") else None)
        print(f"  {name:<20}{mean['mach']:>6.1f}{mean['cost']:>10.3f}{mean['t_bcast']:>9.0f}{mean['wait']:>8.1f}"
              f"{mean['bubble']:>8.3f}   {paper[0]}, {paper[1]}, {paper[2]}, {paper[3]}  "
              f"(ours {100 * (mean['cost'] / full_cost - 1):+.1f}% cost vs Full; paper "
              f"{100 * (paper[1] / PAPER_TABLE2['Full'][1] - 1):+.1f}%)")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(runs)
    ax.bar(names, [statistics.fmean(r["cost"] for r in runs[n]) for n in names], color="tab:blue")
    ax.set_ylabel("USD per step (simulated)")
    ax.set_title("Table 2 ablations (simulated)")
    ax.tick_params(axis="x", labelsize=7)
    save(fig, out, "table2")


def fault_row(base, run, *, target: float, fault_at: float, window: float) -> dict:
    """Peak drop of mu_pool(t) from its pre-fault level; recovery: from the fault until mu_pool is back at the
    target for good (the end of the last stretch below it within ``window``; 0 if it never fell below);
    bubble increase over the fault-free run."""
    before = [mu for t, mu, _ in run.active_trace if fault_at - 600 <= t < fault_at]
    level = statistics.fmean(before) if before else target
    after = [(t, mu) for t, mu, _ in run.active_trace if fault_at <= t <= fault_at + window]
    low = min((mu for _, mu in after), default=level)
    below = [t for t, mu in after if mu < target * (1 - 1e-9)]
    back = next((t - fault_at for t, mu in after if below and t > below[-1]), None) if below else 0.0
    return {"drop": 100 * (1 - low / level), "recovery": back,
            "bubble": 100 * (metrics.bubble_ratio(run) - metrics.bubble_ratio(base))}


def table4(quick: bool, out: Path) -> None:
    steps = 12 if quick else 20
    t = scenarios.T_TRAIN[3]
    at = {"broadcast": 5 * t, "rollout": 6 * t + 1500}
    print(f"Table 4: single-worker faults (workers of mu = mu_min/8 = {scenarios.table4_mu():.4f} traj/s, T_train "
          "1631.2 s, deterministic generation; paper at gamma 1.0)")
    print(f"  {'gamma':<6}{'fault':<36}{'drop %':>8}{'recovery s':>11}{'bubble +pp':>11}   paper: drop %, "
          "recovery s, bubble +pp")
    rows = {}
    for gamma in (1.0, 1.1):
        base = simulate(scenarios.table4(gamma, None, steps=steps, fault_at=0))
        for name, (stage, _) in scenarios.TABLE4_FAULTS.items():
            run = simulate(scenarios.table4(gamma, name, steps=steps, fault_at=at[stage]))
            hit = next(tt for tt, label in run.events if label.startswith("fault:"))
            r = rows[(gamma, name)] = fault_row(base, run, target=run.target, fault_at=hit, window=4 * t)
            rec = "-" if r["recovery"] is None else f"{r['recovery']:.0f}"
            paper = PAPER_TABLE4[name]
            print(f"  {gamma:<6}{name:<36}{r['drop']:>8.2f}{rec:>11}{r['bubble']:>11.2f}   "
                  f"{paper[0]}, {paper[1]}, {paper[2]}" + ("" if gamma == 1.0 else " (paper: gamma 1.0)"))
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.5))
    names = list(scenarios.TABLE4_FAULTS)
    x = range(len(names))
    ax.bar([i - 0.27 for i in x], [PAPER_TABLE4[n][0] for n in names], 0.27, label="paper (gamma 1.0)")
    ax.bar(list(x), [rows[(1.0, n)]["drop"] for n in names], 0.27, label="simulated, gamma 1.0")
    ax.bar([i + 0.27 for i in x], [rows[(1.1, n)]["drop"] for n in names], 0.27, label="simulated, gamma 1.1")
    ax.set_xticks(list(x), [n.replace(": ", "\n") for n in names], fontsize=7)
    ax.set_ylabel("peak throughput drop %")
    ax.legend(fontsize=7)
    save(fig, out, "table4")


def fig4(quick: bool, out: Path) -> None:
    sizes = [8, 32, 128, 1000] if quick else [8, 16, 32, 64, 128, 256, 512, 1000]
    m, chunk = scenarios.SNAPSHOT_8B, 8 * 2**20
    print("Figure 4: T_bcast (q = 1/1.1) vs N, M = 16 GB, Bw = 100 Mbit/s, chunk 8 MiB")
    print("paper: star-limited grows ~ N M / B0; tree-pipelined stays within a small constant factor of "
          "star-unlimited (M/Bw = 1280 s)")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    series = [("star-unlimited", None)] + [(s, b0) for s in ("star-limited", "chain") for b0 in (300, 600, 700, 800)]
    for strategy, b0 in series:
        b0_bps = None if b0 is None else b0 * MBIT
        values = []
        for n in sizes:
            bandwidth = dict.fromkeys(range(1, n + 1), scenarios.BW)
            plan = plan_for(strategy, bandwidth, b0_bps=b0_bps or scenarios.B0)
            values.append(t_bcast(install_times(plan, bandwidth, size=m, chunk=chunk, b0_bps=b0_bps), q=1 / 1.1))
        label = strategy if b0 is None else f"{strategy} B0={b0}"
        print(f"  {label:<24}" + " ".join(f"N={n}:{v:.0f}" for n, v in zip(sizes, values, strict=True)) +
              f"  ({values[-1] / (m / scenarios.BW):.2f} x M/Bw at N={sizes[-1]})")
        ax.plot(sizes, values, ("--" if strategy == "star-limited" else "-"), label=label, lw=1.2)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("active rollout workers N")
    ax.set_ylabel("T_bcast (s)")
    ax.set_title("Figure 4 (simulated)")
    ax.legend(fontsize=6, ncol=2)
    save(fig, out, "fig4")


def fig3a(quick: bool, out: Path) -> None:
    """Cost per step of ECHO-2 (simulated, S = 3 and 4) against the all-datacenter pipelines (8 x A100 at
    their measured step times), assuming, as the paper's matched-accuracy comparison does, equal steps to
    the target accuracy."""
    steps = 10 if quick else 20
    verl = {name: 8 * scenarios.A100 * t / 3600 for name, t in scenarios.VERL.items()}
    print("Figure 3a-style cost (USD per step, 8B): paper reports ECHO-2 33.3-36.3% cheaper at matched accuracy")
    ours = {}
    for s in (3, 4):
        result = simulate(scenarios.config(scenarios.rtx5090_pool(24), s, steps=steps))
        c = metrics.cost_per_step(result)
        ours[f"ECHO-2 S={s}"] = c["total"]
        print(f"  ECHO-2 S={s}: {c['total']:.3f} USD/step (learner {c['learner']:.3f}, {len(result.initial_ids)} "
              f"RTX 5090 {c['workers']:.3f}; step {c['period']:.0f} s, bubble {metrics.bubble_ratio(result):.3f})")
    for name, cost in verl.items():
        saving = ", ".join(f"{k} {100 * (1 - v / cost):.1f}% cheaper" for k, v in ours.items())
        print(f"  {name} (8 x A100, {scenarios.VERL[name]} s/step): {cost:.3f} USD/step; {saving}")
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6, 4))
    x = list(range(0, 101, 10))
    for name, cost in {**verl, **ours}.items():
        ax.plot(x, [cost * k for k in x], "--" if name.startswith("veRL") else "-", label=name)
    ax.set_xlabel("training steps")
    ax.set_ylabel("cumulative cost (USD)")
    ax.set_title("Figure 3a-style cost (simulated ECHO-2)")
    ax.legend()
    save(fig, out, "fig3a")


SECTIONS = {"fig3c": fig3c, "table2": table2, "table4": table4, "fig4": fig4, "fig3a": fig3a}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("sections", nargs="*", metavar="SECTION", help=f"any of {', '.join(SECTIONS)} (default: all)")
    parser.add_argument("--quick", action="store_true", help="fewer steps, sizes and seeds")
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "paper", help="where the PNGs go")
    args = parser.parse_args()
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {', '.join(unknown)}; choose from {', '.join(SECTIONS)}")
    for name in args.sections or SECTIONS:
        SECTIONS[name](args.quick, args.out)
        print()
    return 0


if __name__ == "__main__":
    sys.exit(main())

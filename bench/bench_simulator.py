"""The fleet simulator (simulator/) against the real stack at small N: broadcast time against real relays on
loopback (bench_broadcast.py's processes and token buckets), bubble ratio and pool throughput against a live
job (bench_faults.py's fault-free run: Redis, daphne, Celery, three relaying agents, echo2-learner).

Run: ``.venv/bin/python bench/bench_simulator.py [--sizes 4 8] [--steps 60] [--real-json var/sim-real.json]
[--save-real var/sim-real.json] [--seeds 5] [--json out.json]``
(``--real-json bench/data/sim-real-2026-12-03.json`` is the live run of docs/simulator.md's table.)
``--wan-json var/wan.json`` (what ``bench/bench_wan.py --json`` wrote; ``bench/data/wan-sim-2026-12-05.json`` keeps
12 such rows) compares the simulator's WAN model with the WAN runs instead, row by row (bench/sim_wan.py): T_bcast,
the bubble and the stale share for the same links, error against the 10 % target.

The simulator is calibrated on the live run's own measurements, never on the quantities compared: ``T_train``
(the learner's step reports), each worker's generation rate ``mu_i`` and its variability (lease-to-return
times of every group, read back from Redis' append-only file: the workers' speed while busy, not what the
backpressure let them deliver), the lease round trip (10th percentile of a worker's gap between returning a
lease and taking the next), the learner's per-step overhead outside wait and training (its step period minus
both), the publication latency (the agents' median install time after publication: a 0.3 MB snapshot's
transfer is negligible beside it).
Compared: the bubble ratio (mean of the steps' ``wait / (wait + T_train)``, as fault_audit.py computes it),
the pool's delivered throughput, the step period and the largest lag. Prints a table (quantity, real,
simulated, error %); the target is 10 %. ``--real-json`` reuses a saved live run (it takes ~2 minutes).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from simulator import metrics  # noqa: E402
from simulator.broadcast import install_times, plan_for, t_bcast  # noqa: E402
from simulator.fleet import simulate  # noqa: E402
from simulator.model import MBIT, ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec  # noqa: E402

WARMUP = 2  # steps left out on both sides: the pool filling up, the agents loading the model
NO_WORK_RETRY_S = 0.2  # the site answers a lease request it cannot serve with NoWork(retry_after=0.2)


def worker_rates(groups: list[dict], group_size: int) -> tuple[dict[int, float], float, float]:
    """(mu_i of each worker while busy, cv of one group's generation time, lease round trip in s).

    A lease's groups are generated in one batch and returned one after another; busy time is lease to last
    return. The simulator draws a lease of ``k`` groups as the sum of ``k`` gamma draws, so the per-group cv
    is the leases' cv times ``sqrt(k)``."""
    by_worker: dict[int, dict[int, list[int]]] = {}
    for g in groups:
        by_worker.setdefault(g["worker"], {}).setdefault(g["leased_ms"], []).append(g["returned_ms"])
    rates, spans, sizes, gaps = {}, [], [], []
    for w, leases in by_worker.items():
        ordered = sorted(leases.items())
        busy = [max(returned) - leased for leased, returned in ordered]
        spans += busy
        sizes += [len(returned) for _, returned in ordered]
        gaps += [b[0] - max(a[1]) for a, b in zip(ordered, ordered[1:], strict=False)]
        rates[w] = group_size * sum(len(r) for r in leases.values()) / (sum(busy) / 1000)
    cv = statistics.pstdev(spans) / statistics.fmean(spans) * statistics.fmean(sizes) ** 0.5
    return rates, cv, max(0.0, sorted(gaps)[len(gaps) // 10] / 1000)  # leased ahead: the next lease came first


def step_period(samples: list[list], first: int, last: int) -> float:
    """Seconds per learner step between the polls that first saw steps ``first`` and ``last``."""
    t_first = next(t for t, _, step, _ in samples if step >= first)
    t_last = next(t for t, _, step, _ in samples if step >= last)
    steps_first = next(step for _, _, step, _ in samples if step >= first)
    steps_last = next(step for _, _, step, _ in samples if step >= last)
    return (t_last - t_first) / max(1, steps_last - steps_first)


def real_figures(doc: dict) -> dict:
    """What the live run measured: bubble, throughput, period, T_train, lag (steps after WARMUP)."""
    steps = [m for m in doc["metrics"] if m["step"] > WARMUP]
    last = max(m["step"] for m in steps)
    running = [s for s in doc["samples"] if s[1] == "running" and s[2] > WARMUP]
    t0, t1 = running[0], running[-1]
    return {"bubble": statistics.fmean(m["wait_s"] / (m["wait_s"] + m["t_train"]) for m in steps),
            "wait": statistics.fmean(m["wait_s"] for m in steps),
            "t_train": statistics.fmean(m["t_train"] for m in steps),
            "throughput": (t1[3] - t0[3]) / (t1[0] - t0[0]),
            "period": step_period(doc["samples"], WARMUP + 1, last),
            "max_lag": max(m["max_staleness"] for m in steps),
            "t_bcast": median_or_none(s["t_bcast"] for s in doc["snapshots"] if s["t_bcast"] is not None),
            "install": median_or_none(i["seconds"] for i in doc["installs"])}


def median_or_none(values) -> float | None:
    values = list(values)
    return statistics.median(values) if values else None


def overhead(doc: dict, real: dict, *, split: bool) -> tuple[float, float]:
    """(seconds per step, extra seconds per publication step) the learner spends outside waiting and training.

    Their sum per publication period is what the step period leaves: ``kappa (period - wait - T_train)``.
    Uniform: all of it spread over every step. Split: the publication step's extra is the difference between
    the durations of publication and other steps (medians of the long and short gaps between the learner's
    prompt top-ups, which alternate at kappa = 2), less the difference of their mean waits."""
    per_step = max(0.0, real["period"] - real["wait"] - real["t_train"])
    if not split:
        return per_step, 0.0
    gaps = [b - a for a, b in zip(doc["top_ups"], doc["top_ups"][1:], strict=False)][WARMUP:]
    gaps = sorted(g / 1000 for g in gaps if g < 3000)
    short, long = statistics.median(gaps[: len(gaps) // 2]), statistics.median(gaps[len(gaps) // 2:])
    kappa = doc["job"]["kappa"]
    steps = [m for m in doc["metrics"] if m["step"] > WARMUP]
    wait_pub = statistics.fmean(m["wait_s"] for m in steps if m["step"] % kappa == 0)
    wait_other = statistics.fmean(m["wait_s"] for m in steps if m["step"] % kappa)
    publish = max(0.0, long - short - (wait_pub - wait_other))
    return max(0.0, per_step - publish / kappa), publish


def calibrate(doc: dict, real: dict, *, seed: int, split: bool = True) -> SimConfig:
    """The simulator configured from the live run's measurements (see the module docstring)."""
    job = doc["job"]
    rates, cv, lease_rtt = worker_rates(doc["groups"], job["group"])
    workers = [WorkerSpec(w, job["price_per_hour"], mu, bandwidth_bps=100 * MBIT) for w, mu in sorted(rates.items())]
    per_step, publish = overhead(doc, real, split=split)
    learner = LearnerSpec(t_train=real["t_train"], batch=job["batch"], group=job["group"], staleness=job["staleness"],
                          kappa=job["kappa"], snapshot_bytes=job["snapshot_bytes"] or 335_592, overhead_s=per_step,
                          publish_overhead_s=publish)
    net = NetSpec(b0_bps=100 * MBIT, chunk_bytes=1 << 20, latency_s=real["install"])
    control = ControlSpec(gamma=1.1, activation="fixed", fixed_ids=tuple(sorted(rates)), controller=False)
    return SimConfig(workers, learner, net, control, steps=len(doc["metrics"]), seed=seed, cv=cv,
                     lease_groups=2, lease_latency_s=lease_rtt, lease_retry_s=NO_WORK_RETRY_S, lease_batch=True,
                     warmup_steps=WARMUP)


def simulated_figures(config: SimConfig, seeds: int) -> dict:
    """The same quantities from the simulator, averaged over ``seeds`` runs."""
    runs = []
    for k in range(seeds):
        result = simulate(dataclasses.replace(config, seed=config.seed + k))
        steps = metrics.counted(result, WARMUP)
        runs.append({"bubble": metrics.mean_step_bubble(result, WARMUP),
                     "throughput": metrics.pool_throughput(result, WARMUP),
                     "period": (result.end - steps[0].start) / len(steps), "max_lag": result.trained_max_lag,
                     "t_bcast": median_or_none(result.t_bcast.values())})  # None: no publication timed
    means = {}
    for k in runs[0]:
        got = [r[k] for r in runs if r[k] is not None]
        means[k] = statistics.fmean(got) if got else None
    return means


def wan_config(doc: dict, *, seed: int, flows: bool = True, timing: dict | None = None) -> SimConfig:
    """The simulator for one bench_wan.py row (bench/sim_wan.py ``wan_config``)."""
    from sim_wan import wan_config as build

    return build(doc, seed=seed, flows=flows, timing=timing)


def broadcast_rows(sizes: list[int], args: argparse.Namespace) -> list[dict]:
    """Real relays (bench_broadcast.run_once) beside the simulator's install times, chain and star-limited."""
    import bench_broadcast as bb

    from dataplane.broadcast.store import write_version
    from dataplane.snapshot import build_manifest

    m, c = int(args.mb * 1e6), args.chunk_kb * 1024
    bw = args.bw_mbit * MBIT
    b0 = args.ratio * bw
    payload = os.urandom(m)
    manifest = build_manifest(payload, job_id=bb.JOB, version=bb.VERSION, chunk_bytes=c)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        snap_dir = write_version(Path(tmp), manifest, payload)
        manifest_path = Path(tmp) / "manifest.json"
        manifest_path.write_text(manifest.model_dump_json())
        for n in sizes:
            for strategy in ("chain", "star-limited"):
                real = bb.run_once(strategy, n, snap_dir=snap_dir, manifest_path=manifest_path, bw=bw, b0=b0)
                bandwidth = dict.fromkeys(range(1, n + 1), bw)
                times = install_times(plan_for(strategy, bandwidth, b0_bps=b0), bandwidth, size=m, chunk=c, b0_bps=b0)
                rows.append({"strategy": strategy, "n": n, "real": real["t_q"], "sim": t_bcast(times, q=bb.Q)})
    return rows


def error(real: float, sim: float) -> str:
    return f"{100 * (sim - real) / real:+.1f}" if real else "-"


def print_table(broadcast: list[dict], real: dict, sims: dict[str, dict]) -> None:
    """One row per quantity: the real figure, then each simulation and its error against it."""
    if broadcast:
        print(f"{'quantity':<38}{'real':>9}{'simulated':>16}{'err %':>8}")
        for r in broadcast:
            label = f"T_bcast {r['strategy']} N={r['n']} (s)"
            print(f"{label:<38}{r['real']:>9.2f}{r['sim']:>16.2f}{error(r['real'], r['sim']):>8}")
    names = list(sims)
    print(f"{'quantity':<38}{'real':>9}" + "".join(f"{n:>16}{'err %':>8}" for n in names))
    for key, label, fmt in (("bubble", "bubble ratio (mean of steps)", ".3f"),
                            ("throughput", "pool throughput (records/s)", ".1f"),
                            ("period", "step period (s)", ".3f"), ("max_lag", "largest lag trained (steps)", ".1f")):
        print(f"{label:<38}{real[key]:>9{fmt}}" + "".join(
            f"{sims[n][key]:>16{fmt}}{error(real[key], sims[n][key]):>8}" for n in names))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[4, 8], help="fleet sizes of the broadcast check "
                        "(none: skip it)")
    parser.add_argument("--mb", type=float, default=4.0)
    parser.add_argument("--bw-mbit", type=float, default=8.0)
    parser.add_argument("--ratio", type=float, default=4.0)
    parser.add_argument("--chunk-kb", type=int, default=32)
    parser.add_argument("--steps", type=int, default=60, help="learner steps of the live job")
    parser.add_argument("--real-json", type=Path, help="reuse a live run saved by --save-real (skips the stack)")
    parser.add_argument("--save-real", type=Path, default=ROOT / "var" / "sim-real.json")
    parser.add_argument("--seeds", type=int, default=5, help="simulator runs averaged")
    parser.add_argument("--json", type=Path, help="write the comparison here")
    parser.add_argument("--wan-json", type=Path, help="compare against a bench/bench_wan.py --json run instead (its "
                        "links, T_bcast and bubble per row; the loopback references are skipped)")
    parser.add_argument("--wan-feeder", choices=("measured", "protocol"), default="measured",
                        help="with --wan-json: the learner's prompt top-up at the run's measured feeder cycle "
                        "(bench/sim_wan.py feeder_cycle), or at its round trips alone (the model before it)")
    args = parser.parse_args()
    if args.wan_json:
        from sim_wan import print_wan, wan_rows

        rows = wan_rows(json.loads(args.wan_json.read_text()), args.seeds, feeder=args.wan_feeder == "measured")
        print_wan(rows)
        if args.json:
            args.json.write_text(json.dumps({"wan": rows}, indent=1))
        return 0

    broadcast = broadcast_rows(args.sizes, args) if args.sizes else []
    if args.real_json:
        doc = json.loads(args.real_json.read_text())
    else:
        import sim_real

        doc = sim_real.real_run(steps=args.steps, workdir=ROOT / "var" / "sim-real")
        args.save_real.parent.mkdir(parents=True, exist_ok=True)
        args.save_real.write_text(json.dumps(doc, indent=1))
        print(f"live run saved to {args.save_real}")
    real = real_figures(doc)
    sims = {}
    for name, split in (("uniform", False), ("publish split", True)):
        config = calibrate(doc, real, seed=0, split=split)
        print(f"calibration ({name} overhead): T_train {real['t_train']:.3f} s, overhead "
              f"{config.learner.overhead_s:.3f} s/step + {config.learner.publish_overhead_s:.3f} s/publication, mu_i "
              + ", ".join(f"{w.throughput:.1f}" for w in config.workers) + f" records/s, cv {config.cv:.2f}, lease "
              f"round trip {config.lease_latency_s:.3f} s, publication to install {config.net.latency_s:.2f} s")
        sims[name] = simulated_figures(config, args.seeds)
    print_table(broadcast, real, sims)
    for name, sim in sims.items():
        off = [k for k in ("bubble", "throughput") if abs(sim[k] - real[k]) > 0.1 * real[k]]
        print(f"{name}: bubble and pool throughput " + ("within 10 %" if not off else
                                                       f"outside 10 % ({', '.join(off)})") + " of the live run")
    if args.json:
        args.json.write_text(json.dumps({"broadcast": broadcast, "real": real, "simulated": sims}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

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

from sim_calibration import WARMUP, calibrate, median_or_none, real_figures  # noqa: E402

from simulator import metrics  # noqa: E402
from simulator.broadcast import install_times, plan_for, t_bcast  # noqa: E402
from simulator.fleet import simulate  # noqa: E402
from simulator.model import MBIT, SimConfig  # noqa: E402


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

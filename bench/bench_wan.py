"""The stack on emulated wide-area links: T_bcast against M/Bw and the simulator, star-limited against
the chain, per-hop throughput, reply latency, reconnects, timeouts, the bubble, and recovery from a partition and
a relay killed mid-broadcast, per profile.

Run: ``.venv/bin/python bench/bench_wan.py [--profiles paper harsh] [--agents 4] [--steps 10] [--hidden 640]
[--full-every 1] [--strategies chain star-limited] [--no-faults] [--fault-steps 60] [--partition-s 40]
[--workdir var/bench-wan] [--json PATH]`` (as root: it builds network namespaces; bench/wan/, docs/wan.md).

Each profile gets fresh namespaces per strategy (learner, site, one per agent, a bridge), the rates shaped by tc
tbf, round trip, jitter and loss added by tc netem where the kernel has it, else by our delay proxy
(``--link-emulation``), and one job of the tiny arithmetic model (``--hidden``
sets the snapshot's size M). The chain run has ``--steps`` clean steps, then (unless ``--no-faults``) its faults
over ``--fault-steps`` more: one agent's link down ``--partition-s`` seconds, then the relay of the next relayed
publication killed 1.5 s after it. The star-limited run (every worker pulls from the learner within B0) has the
clean steps only. Tables: (1) per run, over the clean part's full publications after the base: M, M/Bw (Bw the
median worker link), the site's T_bcast (until 1/gamma of the workers installed: median, ratio, worst) beside the
simulator's for the same links (bench/sim_wan.py: the links alone, and with the run's measured process latencies)
and each one's error, T_all (every agent installed, from the agents' logs), pubs (timed by the site / installed by
all / published), the bubble (mean wait / (wait + train) per step; over the steps after the first two beside the
simulator's, both models, and their errors) and the audit of every record of the whole job (lost, trained twice,
dropped stale); (2) star-limited / chain beside the theory; (3) the wire: per-hop throughput against the link's rate
(the proxies' TCP acknowledgements), the agents' request/reply round trips (p50/p95/p99 at the site's proxy),
reconnects and the timeouts that fired, by kind; (4) recovery from each fault. Where namespaces cannot be built
(not root, no ip or tc) it says why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))  # bench/sim_wan.py and its siblings import each other by module name

from bench.wan import netns, profile  # noqa: E402
from bench.wan.stack import Job  # noqa: E402

COLUMNS = (("profile", "profile", "s"), ("strategy", "strategy", "s"), ("N", "agents", "d"),
           ("chains", "chains", "d"), ("status", "status", "s"), ("M MB", "m_mb", ".2f"),
           ("M/Bw s", "m_over_bw_s", ".3f"),
           ("T_bcast s", "t_bcast_s", ".3f"), ("T/(M/Bw)", "ratio", ".2f"), ("worst s", "t_bcast_max_s", ".3f"),
           ("links s", "sim_links_t_bcast_s", ".3f"), ("err %", "sim_links_err", "+.0f"),
           ("+proc. s", "sim_proc_t_bcast_s", ".3f"), ("err %", "sim_proc_err", "+.0f"), ("T_all s", "t_all_s", ".3f"),
           ("pubs", "pubs", "s"), ("bubble", "bubble", ".2f"), ("bubble 3+", "sim_real_bubble", ".2f"),
           ("links", "sim_links_bubble", ".2f"), ("err %", "sim_links_bubble_err", "+.0f"),
           ("+proc.", "sim_proc_bubble", ".2f"), ("err %", "sim_proc_bubble_err", "+.0f"),
           ("lost", "lost", "d"), ("twice", "trained_twice", "d"), ("stale", "dropped_stale", "d"),
           ("cpu busy", "cpu_busy", ".0%"), ("run s", "seconds", ".0f"))
TIMELINE = (("profile", "profile", "s"), ("strategy", "strategy", "s"), ("N", "agents", "d"),
            ("versions", "versions", "d"), ("first byte s", "first_byte_s", ".2f"), ("seeds s", "seed_s", ".2f"),
            ("lag/hop s", "lag_s", ".3f"), ("last byte s", "last_byte_s", ".2f"), ("chain/seed", "over_seed", ".2f"),
            ("cores", "cpu_cores", "d"),
            ("machine", "cpu_machine", ".2f"), ("busy", "cpu_busy", ".0%"), ("stack", "cpu_stack", ".2f"),
            ("agents", "cpu_agents", ".2f"), ("proxies", "cpu_proxies", ".2f"), ("learner", "cpu_learner", ".2f"),
            ("site", "cpu_site", ".2f"), ("load", "cpu_load", ".2f"))
WIRE = (("profile", "profile", "s"), ("strategy", "strategy", "s"), ("N", "agents", "d"), ("hops", "hops", "d"),
        ("hop Mbit/s", "hop_mbit_s", ".1f"), ("hop/link", "hop_ratio", ".2f"), ("seed hop/link", "seed_ratio", ".2f"),
        ("relay hop/link", "relay_ratio", ".2f"), ("replies", "reply_n", "d"), ("p50 ms", "reply_p50", ".0f"),
        ("p95 ms", "reply_p95", ".0f"), ("p99 ms", "reply_p99", ".0f"), ("reconnects", "reconnect_count", "d"),
        ("attempts", "reconnect_lines", "d"),
        ("timeouts fired", "timeouts_line", "s"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", nargs="+", default=["paper", "harsh"],
                        help="Shipped profiles (bench/wan/profiles/) or TOML files, one run each.")
    parser.add_argument("--agents", type=int, default=4, help="Agents per run (N); the profile's last link is kept "
                        "for the last agent (harsh: the slow worker).")
    parser.add_argument("--steps", type=int, default=10, help="Clean learner steps per job (a publication every "
                        "S - 1).")
    parser.add_argument("--staleness", type=int, default=3, help="The job's staleness budget S; it publishes every "
                        "kappa = S - 1 steps. Raise it (and --steps) to space publications out, so that a broadcast "
                        "does not share the links with the one before (the tiny job trains a step in ~0.3 s).")
    parser.add_argument("--hidden", type=int, default=640, help="The tiny model's hidden size (M grows as its "
                        "square; 640: 16.4 MB, four 4 MiB chunks).")
    parser.add_argument("--full-every", type=int, default=1, help="A full snapshot every this many publications, "
                        "deltas between (the job's snapshot_full_every; 1: all full, what T/(M/Bw) measures).")
    parser.add_argument("--strategies", nargs="+", default=["chain", "star-limited"],
                        help="Broadcast strategies, one run each per profile (dataplane/broadcast/strategies/); "
                        "'none' runs no job (with --wire-only: the data plane alone).")
    parser.add_argument("--no-faults", dest="faults", action="store_false",
                        help="No partition and no relay fault in the chain run.")
    parser.add_argument("--fault-steps", type=int, default=60, help="Steps the chain run goes on for after the clean "
                        "ones, while the faults happen (the job must outlast them).")
    parser.add_argument("--partition-s", type=float, default=40.0,
                        help="How long the partitioned agent's link is down.")
    parser.add_argument("--sim-seeds", type=int, default=3, help="Simulator runs averaged for each row's simulated "
                        "T_bcast and bubble (bench/sim_wan.py).")
    parser.add_argument("--run-timeout", type=float, default=420.0, help="Give up on a job after this many seconds.")
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench-wan", help="State and logs (wiped).")
    parser.add_argument("--wire-only", action="store_true", help="Also run the data plane alone (bench/wan/wire.py): "
                        "the same namespaces, links, proxies, relay code and chain plan, no site, learner or "
                        "generation; its row is strategy 'wire-only'.")
    parser.add_argument("--wire-rounds", type=int, default=5, help="Publications in the wire-only run.")
    parser.add_argument("--part-kib", type=int, help="The wire-only run's part size in KiB (default: the relays' "
                        "own, dataplane/broadcast/framing.py DEFAULT_PART_BYTES).")
    parser.add_argument("--no-buckets", dest="buckets", action="store_false", help="The wire-only run without the "
                        "relays' token buckets (tbf alone shapes the links).")
    parser.add_argument("--wire-load", choices=("none", "procs", "threads"), default="none", help="The wire-only "
                        "run's synthetic load (bench/wan/burn.py): a pure-Python spinner beside each agent relay as "
                        "a process of its own (procs: cores shared) or as a thread in the relay's process (threads: "
                        "cores and the GIL shared, like the agent's generation thread).")
    parser.add_argument("--no-naive", dest="naive", action="store_false", help="The wire-only run without the "
                        "naive reference relay (bench/wan/naive.py) it otherwise runs beside ours in every round.")
    parser.add_argument("--add-delay-ms", type=float, default=0.0, help="Add this to every link's round trip, so "
                        "every path (two links) gets this much more one-way delay (issue 49: the rates profile "
                        "with +20 ms).")
    parser.add_argument("--link-emulation", choices=netns.EMULATIONS, default="auto", help="Who adds each link's "
                        "round trip, jitter and loss: tc netem (where the kernel has sch_netem; the proxies then only "
                        "tap), our delay proxy (bench/wan/proxy.py), or auto: netem if usable, else the proxy. tbf "
                        "shapes the rates either way.")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON here (bench/bench_simulator.py "
                        "--wan-json reads it).")
    args = parser.parse_args(argv)
    if args.steps < 4 or args.agents < 1 or args.fault_steps < 1 or args.partition_s <= 0:
        parser.error("--steps must be at least 4, --agents and --fault-steps at least 1, --partition-s positive")
    if args.staleness < 2:
        parser.error(f"--staleness must be at least 2 (kappa = S - 1 >= 1), got {args.staleness}")
    args.strategies = [s for s in args.strategies if s != "none"]  # none: with --wire-only, the data plane alone
    unknown = set(args.strategies) - {"chain", "star-limited", "star-unlimited"}
    if unknown:
        parser.error(f"unknown strategy {', '.join(sorted(unknown))} (chain, star-limited, star-unlimited)")
    return args


def table(rows: list[dict], columns=COLUMNS) -> str:
    lines = [" | ".join(h for h, _, _ in columns), " | ".join("-" * len(h) for h, _, _ in columns)]
    for row in rows:
        lines.append(" | ".join("-" if row.get(key) is None else format(row[key], spec) for _, key, spec in columns))
    return "\n".join(lines)


def star_vs_chain(rows: list[dict]) -> list[str]:
    """star-limited T_bcast / chain T_bcast per profile, beside the closed forms' ratio (docs/broadcast.md: star
    max(M/Bw, N M/B0), chain M/Bw + (L-1) c/Bw) and the paper's N Bw / B0 (2.0 at N = 4, B0 = 2 Bw)."""
    from simulator.broadcast import closed_form

    lines = ["profile | N | chain T_bcast s | star-limited T_bcast s | star/chain | closed forms | N Bw/B0",
             "------- | - | --------------- | ---------------------- | ---------- | ------------ | -------"]
    for chain in (r for r in rows if r["strategy"] == "chain"):
        star = next((r for r in rows if r["strategy"] == "star-limited" and r["profile"] == chain["profile"]
                     and r["agents"] == chain["agents"]), None)
        if star is None:
            continue
        n, m, c = chain["agents"], chain["m_bytes"] or 0, chain["chunk_bytes"] or 0
        bw, b0 = chain["bw_bps"], chain["b0_bps"]
        theory = (closed_form("star-limited", n, size=m, bw=bw, b0=b0, chunk=c)
                  / closed_form("chain", n, size=m, bw=bw, b0=b0, chunk=c)) if m and c else None
        ratio = star["t_bcast_s"] / chain["t_bcast_s"] if star["t_bcast_s"] and chain["t_bcast_s"] else None
        lines.append(" | ".join((chain["profile"], str(n), _f(chain["t_bcast_s"]), _f(star["t_bcast_s"]),
                                 _f(ratio, ".2f"), _f(theory, ".2f"), _f(n * bw / b0, ".2f"))))
    return lines


def fault_lines(rows: list[dict]) -> list[str]:
    lines = ["profile | N | fault | node | recovery | lost | twice | note",
             "------- | - | ----- | ---- | -------- | ---- | ----- | ----"]
    for r in rows:
        f = r.get("faults") or {}
        audit = (str(r["lost"]), str(r["trained_twice"]))
        if k := f.get("relay"):
            what = "-" if k.get("killed_after_publication_s") is None else (
                f"killed {k['killed_after_publication_s']:.1f} s after v{k['version']}'s publication; plan repaired "
                f"{_f(k.get('repair_s'), '.1f')} s later ({k['child']} now from {k.get('child_parent') or '?'}); "
                f"{k['child']} installed v{k.get('child_version', '?')} {_f(k.get('child_installed_s'), '.1f')} s "
                "after the kill")
            lines.append(" | ".join((r["profile"], str(r["agents"]), "relay killed mid-broadcast", k["node"], what,
                                     *audit, k.get("error") or "")))
        if p := f.get("partition"):
            what = "-" if p.get("version_at_up") is None else (
                f"reconnected {_f(p.get('reconnect_s'), '.1f')} s, generating under v{p['version_at_up']}+ "
                f"{_f(p.get('generating_s'), '.1f')} s after the link came back")
            lines.append(" | ".join((r["profile"], str(r["agents"]), f"link down {_f(p.get('partition_s'), 'g')} s",
                                     p["node"], what, *audit,
                                     (p.get("error") or "") + (f" (last seen: {p['last_seen']})" if p.get("last_seen")
                                                               else ""))))
        if r.get("fault_error"):
            lines.append(f"{r['profile']} | {r['agents']} | the fault script stopped | - | {r['fault_error']} "
                         "| - | - |")
    return lines


def _f(value, spec: str = ".3f") -> str:
    return "-" if value is None else format(value, spec)


def finish(row: dict, topology: profile.Topology, sim_seeds: int) -> dict:
    """The table's derived columns: chains, MB, pubs, reply percentiles, timeouts, and the simulator beside the run
    (:func:`simulator_columns`)."""
    reply = row["reply_ms"]
    timeouts = row["timeouts"]
    row.update(chains=profile.chains(topology) if row["strategy"] == "chain" else 0,
               m_mb=row["m_bytes"] and row["m_bytes"] / 1e6, pubs=f"{row['timed']}/{row['all_installed']}/"
               f"{row['publications']}", bw_bps=statistics.median(a.up_bps for a in topology.agents),
               b0_bps=topology.learner.up_bps, reply_n=reply["n"], reply_p50=reply["p50"], reply_p95=reply["p95"],
               reply_p99=reply["p99"], reconnect_count=sum(row["reconnects"].values()),
               timeouts_line=", ".join(f"{k} {n}" for k, n in sorted(timeouts.items())) or "none")
    when = row.get("timeline") or {}
    row.update({k: v for k, v in when.items() if k != "cpu_groups"},
               **{f"cpu_{g}": c for g, c in (when.get("cpu_groups") or {}).items()})
    row.update(simulator_columns(row, sim_seeds))
    return row


def simulator_columns(row: dict, seeds: int) -> dict:
    """The simulator beside the row (bench/sim_wan.py ``wan_rows``, what ``bench_simulator.py --wan-json`` prints):
    T_bcast and the bubble on the links alone (``sim_links_*``) and with the run's measured process latencies
    (``sim_proc_*``), each with its error against the run (%); the bubble compared is over the steps after the
    first two (``sim_real_bubble``). Calibrated on the row alone (its ``calibration``, bench/wan/run.py).
    ``sim_wan`` keeps the comparison; ``sim_note`` says why there is none."""
    import sim_wan

    found = sim_wan.wan_rows([row], seeds)[0]
    if "error" in found:
        return {"sim_note": f"the simulator could not be calibrated on this run: {found['error']}"}
    out = {"sim_wan": found, "sim_real_bubble": found["bubble"]}
    for key, real in (("t_bcast", row.get("t_bcast_s")), ("bubble", found["bubble"])):
        for model, prefix in (("links", "sim_links"), ("sim", "sim_proc")):
            sim = found[f"{model}_{key}"]
            name = f"{prefix}_t_bcast_s" if key == "t_bcast" else f"{prefix}_bubble"
            out[name] = sim
            out[f"{prefix}_err" if key == "t_bcast" else f"{prefix}_bubble_err"] = \
                100 * (sim - real) / real if sim is not None and real else None
    return out
    return row


def wire_row(topology: profile.Topology, args: argparse.Namespace) -> dict:
    """The data plane alone on ``topology`` (bench/wan/wire.py), M the job's snapshot size for ``--hidden``."""
    from bench.wan.wire import run_wire
    from dataplane.broadcast.framing import DEFAULT_PART_BYTES
    from dataplane.snapshot import DEFAULT_CHUNK_BYTES

    size = 4 * args.hidden * args.hidden * 10  # ~ the tiny model's fp32 safetensors (hidden 640: 16.4 MB)
    part = args.part_kib * 1024 if args.part_kib else DEFAULT_PART_BYTES
    print(f"{topology.name} wire-only: {args.agents} agents, {args.wire_rounds} rounds of {size / 1e6:.1f} MB, "
          f"parts {part // 1024} KiB{'' if args.buckets else ', no token buckets'}, load {args.wire_load} ...",
          flush=True)
    row = run_wire(topology, args.workdir / f"{topology.name}-wire", size=size, chunk=DEFAULT_CHUNK_BYTES,
                   part_bytes=part, rounds=args.wire_rounds, buckets=args.buckets, load=args.wire_load,
                   with_naive=args.naive)
    when = row.get("timeline") or {}
    row.update({k: v for k, v in when.items() if k != "cpu_groups"},
               **{f"cpu_{g}": c for g, c in (when.get("cpu_groups") or {}).items()},
               chains=profile.chains(topology), m_mb=row["m_bytes"] / 1e6,
               pubs=f"{row['timed']}/{row['all_installed']}/{row['publications']}")
    return row


def _s(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = netns.unavailable() or (None if shutil.which("redis-server") else "redis-server is not installed")
    if reason:
        print(f"bench_wan: skipped: {reason}")
        return 0
    from bench.wan.faults import FaultPlan
    from bench.wan.run import run_job

    try:
        emulation, why = netns.choose_emulation(args.link_emulation)
    except ValueError as err:
        print(f"bench_wan: {err}")
        return 2
    print(f"links: rates by tc tbf; round trip, jitter and loss by "
          f"{'tc netem' if emulation == 'netem' else 'our delay proxy (bench/wan/proxy.py)'} ({why})", flush=True)
    netns.on_signals_exit()
    args.workdir = args.workdir.resolve()
    shutil.rmtree(args.workdir, ignore_errors=True)
    rows = []
    for name in args.profiles:
        topology = profile.with_added_delay(profile.load(name).with_agents(args.agents), args.add_delay_ms)
        if args.wire_only:
            rows.append(wire_row(topology, args))
        for strategy in args.strategies:
            faults = FaultPlan(after_step=args.steps, partition_s=args.partition_s) \
                if args.faults and strategy == "chain" else None
            steps = args.steps + (args.fault_steps if faults else 0)
            print(f"{name} {strategy}: {args.agents} agents, {steps} steps"
                  + (f" (faults after step {args.steps})" if faults else "") + " ...", flush=True)
            job = Job(steps=steps, hidden=args.hidden, full_every=args.full_every, strategy=strategy,
                      staleness=args.staleness)
            where = args.workdir / f"{topology.name}-{strategy}"
            try:
                row = run_job(topology, where, job, timeout=args.run_timeout, faults=faults, emulation=emulation)
            except (RuntimeError, OSError, httpx.HTTPError) as err:
                print(f"bench_wan: the {name} {strategy} run broke: {type(err).__name__}: {err}; logs in {where}")
                return 1
            rows.append(finish(row, topology, args.sim_seeds))
            if row.get("sim_note"):
                print(f"  {row['sim_note']}")
    print(f"\nT_bcast on emulated WAN links (tiny model, hidden {args.hidden}, full every {args.full_every}; "
          f"Bw the median worker link; the clean steps; delay, jitter and loss by {emulation}; the simulator "
          "(bench/sim_wan.py) on the links alone and with the run's measured process latencies, each with its error)")
    print(table(rows))
    if len(pairs := star_vs_chain(rows)) > 2:
        print("\nStar-limited against chain (the same links)")
        print("\n".join(pairs))
    print("\nWhere the broadcast's time goes (medians over versions; seconds after the publication: the first byte "
          "acknowledged, the seeds' transfer, what each relayed hop adds after its parent's last byte, the last "
          "byte, first to last byte over the seeds' own transfer; cores used from the publication to the last byte: "
          "the machine's (everyone's), its busy share, and the stack's by group; bench/wan/timeline.py, each run's "
          "timeline.txt)")
    print(table(rows, TIMELINE))
    wire = [r for r in rows if r["strategy"] == "wire-only"]
    if wire:
        print("\nWire-only rounds T_bcast/(M/Bw): " + "; ".join(
            f"{r['profile']} parts {r['part_bytes'] // 1024} KiB{'' if r['buckets'] else ' no buckets'}, "
            f"load {r['load']}: "
            + ", ".join(f"{x:.2f}" for x in r["ratios"]) for r in wire))
        for r in (r for r in wire if "naive_ratio" in r):
            delay = f", +{args.add_delay_ms:g} ms one way" if args.add_delay_ms else ""
            print(f"Ours against the naive relay (bench/wan/naive.py; same chains, links and proxies, rounds "
                  f"alternated), {r['profile']}{delay}, M = {r['m_bytes'] / 1e6:.1f} MB, load {r['load']}:\n"
                  f"  ours  T_bcast/(M/Bw) {r['ratio']:.2f} (rounds {', '.join(f'{x:.2f}' for x in r['ratios'])})\n"
                  f"  naive T_bcast/(M/Bw) {r['naive_ratio']:.2f} (rounds "
                  f"{', '.join(f'{x:.2f}' for x in r['naive_ratios'])})\n"
                  f"  ours/naive {r['ours_over_naive']:.3f} (per round "
                  f"{', '.join(f'{x:.2f}' for x in r['ours_over_naive_rounds'])}); lag per relayed hop ours "
                  f"{_s(r['timeline'].get('lag_s'))} s, naive {_s(r['naive_timeline'].get('lag_s'))} s; seeds ours "
                  f"{_s(r['timeline'].get('seed_s'))} s, naive {_s(r['naive_timeline'].get('seed_s'))} s")
    rows = [r for r in rows if r["strategy"] != "wire-only"] + wire
    print("\nThe wire (clean steps): per-hop throughput against the link, the agents' round trips at the site, "
          "reconnects, timeouts")
    print(table(rows, WIRE))
    if any(r.get("faults") or r.get("fault_error") for r in rows):
        print("\nFaults and recovery (the audit covers the whole job)")
        print("\n".join(fault_lines(rows)))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(rows, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The stack on emulated wide-area links (issue 30): T_bcast against M/Bw and the learner's bubble, per profile.

Run: ``.venv/bin/python bench/bench_wan.py [--profiles paper harsh] [--agents 4] [--steps 10] [--hidden 640]
[--full-every 1] [--workdir var/bench-wan] [--json PATH]`` (as root: it builds network namespaces; bench/wan/,
docs/wan.md).

Each profile gets fresh namespaces (learner, site, one per agent, a bridge), the rates shaped by tc tbf, round
trip, jitter and loss added by our delay proxy, and one job of the tiny arithmetic model (``--hidden`` sets the
snapshot's size M) with agents relaying along the site's chains (N_ch = floor(B0/Bw)). One row per profile, over
the full publications after the base: M, M/Bw (Bw the median worker link), the site's T_bcast (until 1/gamma of the
workers installed: median, ratio to M/Bw, worst), T_all (until every agent installed, from the agents' logs),
pubs (timed by the site / installed by all / published), the learner's bubble (mean wait / (wait + train) per
step) and the audit of every record (lost, trained twice, dropped stale). Where namespaces cannot be built (not
root, no ip or tc) it says why and exits 0.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.wan import netns, profile  # noqa: E402
from bench.wan.stack import Job  # noqa: E402

COLUMNS = (("profile", "profile", "s"), ("N", "agents", "d"), ("chains", "chains", "d"), ("status", "status", "s"),
           ("M MB", "m_mb", ".2f"), ("M/Bw s", "m_over_bw_s", ".3f"), ("T_bcast s", "t_bcast_s", ".3f"),
           ("T/(M/Bw)", "ratio", ".2f"), ("worst s", "t_bcast_max_s", ".3f"), ("T_all s", "t_all_s", ".3f"),
           ("T_all/(M/Bw)", "ratio_all", ".2f"), ("pubs", "pubs", "s"), ("bubble", "bubble", ".2f"),
           ("lost", "lost", "d"), ("twice", "trained_twice", "d"), ("stale", "dropped_stale", "d"),
           ("run s", "seconds", ".0f"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--profiles", nargs="+", default=["paper", "harsh"],
                        help="Shipped profiles (bench/wan/profiles/) or TOML files, one run each.")
    parser.add_argument("--agents", type=int, default=4, help="Agents per run (N); the profile's last link is kept "
                        "for the last agent (harsh: the slow worker).")
    parser.add_argument("--steps", type=int, default=10, help="Learner steps per job (a publication every 2).")
    parser.add_argument("--hidden", type=int, default=640, help="The tiny model's hidden size (M grows as its "
                        "square; 640: 16.4 MB, four 4 MiB chunks).")
    parser.add_argument("--full-every", type=int, default=1, help="A full snapshot every this many publications, "
                        "deltas between (the job's snapshot_full_every; 1: all full, what T/(M/Bw) measures).")
    parser.add_argument("--run-timeout", type=float, default=300.0, help="Give up on a job after this many seconds.")
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench-wan", help="State and logs (wiped).")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON here.")
    return parser.parse_args(argv)


def table(rows: list[dict]) -> str:
    lines = [" | ".join(h for h, _, _ in COLUMNS), " | ".join("-" * len(h) for h, _, _ in COLUMNS)]
    for row in rows:
        lines.append(" | ".join("-" if row.get(key) is None else format(row[key], spec) for _, key, spec in COLUMNS))
    return "\n".join(lines)


def chains(topology: profile.Topology) -> int:
    """N_ch = floor(B0/Bw), the site's number of chains (Bw the usual worker link), at most one per agent."""
    bw = min(a.up_mbit for a in topology.agents[:-1] or topology.agents)
    return min(len(topology.agents), max(1, int(topology.learner.up_mbit // bw)))


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    reason = netns.unavailable() or (None if shutil.which("redis-server") else "redis-server is not installed")
    if reason:
        print(f"bench_wan: skipped: {reason}")
        return 0
    from bench.wan.run import run_job

    netns.on_signals_exit()
    args.workdir = args.workdir.resolve()
    shutil.rmtree(args.workdir, ignore_errors=True)
    rows = []
    for name in args.profiles:
        topology = profile.load(name).with_agents(args.agents)
        print(f"{name}: {args.agents} agents, {args.steps} steps ...", flush=True)
        job = Job(steps=args.steps, hidden=args.hidden, full_every=args.full_every)
        try:
            row = run_job(topology, args.workdir / topology.name, job, timeout=args.run_timeout)
        except (RuntimeError, OSError, httpx.HTTPError) as err:
            where = args.workdir / topology.name
            print(f"bench_wan: the {name} run broke: {type(err).__name__}: {err}; logs in {where}")
            return 1
        rows.append({**row, "chains": chains(topology), "m_mb": row["m_bytes"] and row["m_bytes"] / 1e6,
                     "pubs": f"{row['timed']}/{row['all_installed']}/{row['publications']}"})
    print(f"\nT_bcast on emulated WAN links (tiny model, hidden {args.hidden}, full every {args.full_every}; "
          "Bw the median worker link)")
    print(table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Broadcast time vs fleet size for star-unlimited, star-limited and chain (the shape of the paper's Figure 4,
section 5.5.1) with real relay processes on loopback and token-bucket caps emulating the WAN.

Run: ``.venv/bin/python bench/bench_broadcast.py [--sizes 4 8 16 32 64] [--mb 4] [--bw-mbit 8] [--ratio 4]
[--chunk-kb 32] [--part-kb 256] [--png broadcast.png]``

Each of the N workers is one ``python -m dataplane.broadcast.process`` process capped at ``Bw`` down and up; the
learner is one more, capped at ``B0 = ratio * Bw`` shared by its children (not capped for star-unlimited).
Chains: ``N_ch = floor(B0/Bw)`` (dataplane.broadcast.chains). ``T_bcast`` is publication until a fraction q = 1/1.1
of the workers installed (section 5.5.1); ``T_all`` until every worker did. Theory beside it: star-limited
``max(M/Bw, N*M/B0)``, chain ``M/Bw + (L-1)*p/Bw`` with ``L`` the longest chain and ``p`` what a hop holds before
forwarding: the part (``--part-kb``, a relay forwards a chunk in parts as they arrive) or the chunk if smaller.
``--part-kb`` at least ``--chunk-kb`` is store-and-forward per chunk (what relays did before cut-through).
Prints PASS when chain ``T_bcast`` at the largest N is within 1.25x of ``M/Bw`` (exit 1 otherwise). The
``cpu`` column is the relays' CPU seconds over the run's wall time: near the core count means the machine,
not the caps, set the pace, and the numbers are not to be trusted. Credentials are on, as in production
(docs/trust.md): the learner verifies with a job secret made up here, each worker shows the token it was
"issued", and each parent knows the sha256 of its child's token.
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dataplane.broadcast import BROADCAST_STRATEGIES  # noqa: E402
from dataplane.broadcast.chains import WorkerStats, assemble_chains, n_chains, parents  # noqa: E402
from dataplane.broadcast.driver import RelayProcess, RelayProcessError  # noqa: E402
from dataplane.broadcast.framing import DEFAULT_PART_BYTES  # noqa: E402
from dataplane.broadcast.store import write_version  # noqa: E402
from dataplane.credentials import fingerprint, issue, new_secret  # noqa: E402
from dataplane.snapshot import build_manifest  # noqa: E402

Q = 1 / 1.1
JOB, VERSION = 1, 1


def relay_process(args: list[str], *, secret: str | None = None) -> RelayProcess:
    env = dict(os.environ, ECHO2_JOB_SECRET=secret) if secret else None  # not on the command line
    return RelayProcess(args, cwd=ROOT, env=env)


def run_once(strategy: str, n: int, *, snap_dir: Path, manifest_path: Path, bw: float, b0: float,
             part: int) -> dict:
    n_ch = n_chains(b0, bw)
    if strategy == "chain":
        stats = [WorkerStats(w, bw, last_seen=0.0) for w in range(1, n + 1)]
        plan = assemble_chains(stats, n_ch=n_ch, now=0.0)
        parent_of, longest = parents(plan), max(len(c) for c in plan.chains)
    else:
        parent_of, longest = {w: None for w in range(1, n + 1)}, 1
    learner_args = ["--from-dir", str(snap_dir), "--max-children", str(n_ch if strategy == "chain" else n),
                    "--part-bytes", str(part)]
    if strategy != "star-unlimited":
        learner_args += ["--uplink-bps", str(b0)]
    secret = new_secret()
    tokens = {w: issue(secret, job_id=JOB, worker_id=w, lowest=VERSION, highest=VERSION,
                       expires=int(time.time()) + 3600) for w in parent_of}
    learner = relay_process(learner_args, secret=secret)
    workers = {w: relay_process(["--manifest", str(manifest_path), "--worker-id", str(w), "--downlink-bps", str(bw),
                                 "--uplink-bps", str(bw), "--stall-timeout", "60", f"--credential={tokens[w]}",
                                 "--part-bytes", str(part)])
               for w in parent_of}
    procs = [learner, *workers.values()]
    try:
        ports = {w: proc.wait("listening", 120)["port"] for w, proc in [(None, learner), *workers.items()]}
        for w, p in parent_of.items():  # tell each parent relay which child it serves (fan-out 1), its token's sha256
            if p is not None:
                workers[p].send(cmd="children", worker_ids=[w], sha256={str(w): fingerprint(tokens[w])})
        cpu_before = sum(cpu_seconds(proc.proc.pid) for proc in procs)
        start = time.time()
        for w, p in parent_of.items():
            workers[w].send(cmd="parent", host="127.0.0.1", port=ports[p])
        installed = {w: proc.wait("installed", 900)["t"] for w, proc in workers.items()}
        wall = time.time() - start
        cpu = sum(cpu_seconds(proc.proc.pid) for proc in procs) - cpu_before
    except RelayProcessError as err:
        raise SystemExit(f"{strategy} N={n}: {err}") from None
    finally:
        for proc in procs:
            proc.stop()
    times = sorted(t - start for t in installed.values())
    return {"t_q": times[math.ceil(Q * n) - 1], "t_all": times[-1], "longest": longest, "cpu": cpu, "wall": wall}


def cpu_seconds(pid: int) -> float:
    """User + system CPU of a live process (Linux /proc), so start-up imports are not counted."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def theory(strategy: str, n: int, *, m: int, bw: float, b0: float, c: int, longest: int) -> float:
    if strategy == "star-unlimited":
        return m / bw
    if strategy == "star-limited":
        return max(m / bw, n * m / b0)
    return m / bw + (longest - 1) * c / bw


def plot(rows: list[dict], path: Path, *, m_over_bw: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for strategy, style in zip(BROADCAST_STRATEGIES, ("o-", "s-", "^-"), strict=True):
        pts = [(r["n"], r["t_q"]) for r in rows if r["strategy"] == strategy]
        if pts:
            ax.plot(*zip(*pts, strict=True), style, label=strategy)
            ax.plot(*zip(*[(r["n"], r["theory"]) for r in rows if r["strategy"] == strategy], strict=True),
                    ":", color=ax.lines[-1].get_color(), alpha=0.6)
    ax.axhline(m_over_bw, color="grey", lw=0.8, ls="--", label="M/Bw")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("workers N")
    ax.set_ylabel("T_bcast (s), q = 1/1.1")
    ax.set_title("Snapshot broadcast on loopback (dotted: theory)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8, 16, 32, 64])
    parser.add_argument("--strategies", nargs="+", choices=BROADCAST_STRATEGIES, default=list(BROADCAST_STRATEGIES))
    parser.add_argument("--mb", type=float, default=4.0, help="snapshot size M in MB (10^6 bytes)")
    parser.add_argument("--bw-mbit", type=float, default=8.0, help="per-worker cap Bw in Mbit/s")
    parser.add_argument("--ratio", type=float, default=4.0, help="B0 / Bw")
    parser.add_argument("--chunk-kb", type=int, default=32, help="chunk size c in KiB")
    parser.add_argument("--part-kb", type=int, default=DEFAULT_PART_BYTES // 1024,
                        help="most payload per frame a relay sends, in KiB (>= --chunk-kb: whole chunks)")
    parser.add_argument("--png", type=Path, default=Path("broadcast.png"))
    args = parser.parse_args()

    m, c, part = int(args.mb * 1e6), args.chunk_kb * 1024, args.part_kb * 1024
    bw = args.bw_mbit * 1e6 / 8
    b0 = args.ratio * bw
    payload = os.urandom(m)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=c)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        snap_dir = write_version(Path(tmp), manifest, payload)
        manifest_path = Path(tmp) / "manifest.json"
        manifest_path.write_text(manifest.model_dump_json())
        print(f"M = {m / 1e6:g} MB, c = {c // 1024} KiB, part {min(c, part) // 1024} KiB, "
              f"Bw = {args.bw_mbit:g} Mbit/s, B0 = {args.ratio:g} x Bw, "
              f"M/Bw = {m / bw:.2f} s, {os.cpu_count()} CPUs")
        print(f"{'strategy':<15}{'N':>4}{'L':>4}{'T_bcast':>9}{'T_all':>8}{'theory':>8}{'/(M/Bw)':>9}{'cpu':>6}")
        for n in args.sizes:
            for strategy in args.strategies:
                r = run_once(strategy, n, snap_dir=snap_dir, manifest_path=manifest_path, bw=bw, b0=b0, part=part)
                r.update(strategy=strategy, n=n,
                         theory=theory(strategy, n, m=m, bw=bw, b0=b0, c=min(c, part), longest=r["longest"]))
                rows.append(r)
                print(f"{strategy:<15}{n:>4}{r['longest']:>4}{r['t_q']:>9.2f}{r['t_all']:>8.2f}{r['theory']:>8.2f}"
                      f"{r['t_q'] / (m / bw):>9.2f}{r['cpu'] / r['wall']:>6.2f}", flush=True)
    try:
        plot(rows, args.png, m_over_bw=m / bw)
        print(f"figure: {args.png}")
    except ImportError:
        print("figure skipped: matplotlib is not installed (pip install matplotlib)")
    chain = [r for r in rows if r["strategy"] == "chain"]
    if not chain:
        return 0
    last = max(chain, key=lambda r: r["n"])
    ratio = last["t_q"] / (m / bw)
    ok = ratio <= 1.25
    print(f"{'PASS' if ok else 'FAIL'}: chain T_bcast at N = {last['n']} is {ratio:.2f} x M/Bw (target <= 1.25)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""The data plane alone on the WAN topology (``bench/bench_wan.py --wire-only``): the same namespaces, tbf
rates, delay proxies, relay code (``python -m dataplane.broadcast.process``, the agent's and the learner's
SnapshotRelay and RelayHub) and chain plan (N_ch = floor(B0/Bw) chains of consecutive agents, the origin's uplink
bucket B0 shared by the seeds, each agent's buckets its link rate), with no site, no learner training and no
generation: what the chain achieves against M/Bw when the relays have the machine's cores to themselves.

Each round publishes a fresh random payload of ``size`` bytes (``chunk`` per chunk): every relay process starts
idle, and once all listen they are told their parent at once (the publication, t = 0); T_all is the last install,
T_bcast the ceil(N / gamma)-th (the site's rule). Credentials are issued as the site would (docs/trust.md): the
origin verifies with the job's secret, each agent relay admits its child by the sha256 of the child's credential.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import statistics
import time
from pathlib import Path

from dataplane import credentials
from dataplane.broadcast.driver import MODULE, RelayProcess
from dataplane.broadcast.store import write_version
from dataplane.snapshot import build_manifest

from . import cpu, report, timeline
from .netns import Net
from .profile import Topology, chains
from .stack import BIN, HUB_PORT, RELAY_PORT, WanStack

GAMMA = 1.1
JOB = 1
NAIVE_VERSIONS = 1000
"""The naive relay's rounds are numbered from here in the timeline (ours from 1)."""


def plan(agents: list[str], n_chains: int) -> list[list[str]]:
    """``n_chains`` chains of consecutive agents (the site's plan for equal workers: lengths differ by at most 1)."""
    n_chains = max(1, min(n_chains, len(agents)))
    size, extra = divmod(len(agents), n_chains)
    out, at = [], 0
    for k in range(n_chains):
        take = size + (k < extra)
        out.append(agents[at:at + take])
        at += take
    return out


def relay(net: Net, node: str, argv: list[str], log: Path, *, burn: bool = False) -> RelayProcess:
    """A relay process in ``node``'s namespace (``burn``: inside ``bench.wan.burn``'s spinning thread), its events
    and stderr in ``log``; its name is the node."""
    args = ["relay", *argv] if burn else argv
    return RelayProcess(args, prefix=[*net.exec(node), str(BIN / "python")], log=log, name=node,
                        module="bench.wan.burn" if burn else MODULE,
                        env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))


def run_round(net: Net, where: Path, version: int, *, size: int, chunk: int, part_bytes: int, n_chains: int,
              buckets: bool, timeout: float, procs: list, load: str = "none") -> dict:
    """One publication along the chains; the install time of every agent (seconds after t = 0)."""
    topology = net.topology
    secret = credentials.new_secret()
    payload = os.urandom(size)
    manifest = build_manifest(payload, job_id=JOB, version=version, chunk_bytes=chunk)
    directory = write_version(where / "store", manifest, payload)
    (where / f"manifest-v{version}.json").write_text(manifest.model_dump_json())
    agents = [n for n, _ in topology.nodes() if n.startswith("a")]
    chains = plan(agents, n_chains)
    ids = {node: k + 1 for k, node in enumerate(agents)}
    token = {node: credentials.issue(secret, job_id=JOB, worker_id=ids[node], lowest=version, highest=version,
                                     expires=int(time.time()) + 3600) for node in agents}
    common = ["--part-bytes", str(part_bytes), "--give-up", str(timeout)]
    links = dict(topology.nodes())
    origin = ["--from-dir", str(directory), "--worker-id", "0", "--listen", f"127.0.0.1:{HUB_PORT}",
              "--max-children", str(len(chains)), "--job-secret", secret, *common]
    if buckets:
        origin += ["--uplink-bps", str(topology.learner.up_bps)]
    relays = [relay(net, "learner", origin, where / "origin.log")]
    parent_of = {}
    for chain in chains:
        for k, node in enumerate(chain):
            parent_of[node] = ("learner", HUB_PORT) if k == 0 else (chain[k - 1], RELAY_PORT)
            argv = ["--manifest", str(where / f"manifest-v{version}.json"), "--worker-id", str(ids[node]),
                    "--listen", f"127.0.0.1:{RELAY_PORT}", "--credential", token[node], *common]
            if k + 1 < len(chain):
                child = chain[k + 1]
                argv += ["--child", f"{ids[child]}={credentials.fingerprint(token[child])}"]
            if buckets:
                down = links[node].down_mbit * 1e6 / 8
                argv += ["--uplink-bps", str(links[node].up_bps), "--downlink-bps", str(down)]
            relays.append(relay(net, node, argv, where / f"relay-{node}.log", burn=load == "threads"))
    procs.extend((f"agent-{r.name}" if r.name != "learner" else "learner", r.proc) for r in relays)
    published, done = _broadcast(net, relays, parent_of, timeout)
    if any(e["sha256"] != manifest.sha256 for e in done.values()):
        raise RuntimeError(f"v{version}: an installed payload does not match the manifest")
    return _installs(version, published, done)


def _broadcast(net: Net, relays: list[RelayProcess], parent_of: dict[str, tuple[str, int]],
               timeout: float) -> tuple[float, dict[str, dict]]:
    """Once every relay listens, each is told its parent at once (t = 0, returned): each agent's ``installed``
    event. The relays are stopped either way."""
    try:
        for r in relays:
            r.wait("listening", 30)
        published = time.time()
        for r in relays[1:]:
            host, port = parent_of[r.name]
            r.send(cmd="parent", host=net.address(host), port=port)
        return published, {r.name: r.wait("installed", timeout) for r in relays[1:]}
    finally:
        for r in relays:
            r.stop()


def _installs(version: int, published: float, done: dict[str, dict]) -> dict:
    latency = sorted(e["t"] - published for e in done.values())
    return {"version": version, "published": published, "installs_s": latency, "t_all_s": latency[-1],
            "t_bcast_s": latency[math.ceil(len(latency) / GAMMA) - 1],
            "from_fallback": sum(e["stats"]["from_fallback"] for e in done.values())}


def run_naive_round(net: Net, where: Path, version: int, *, size: int, n_chains: int, timeout: float,
                    procs: list) -> dict:
    """The same publication along the same chains, ports, proxies and links with the naive relay
    (bench/wan/naive.py): the reference beside ours. ``version`` only names the round (NAIVE_VERSIONS + k)."""
    topology = net.topology
    payload = os.urandom(size)
    file = where / f"naive-{version}.bin"
    file.write_bytes(payload)
    digest = hashlib.sha256(payload).hexdigest()
    agents = [n for n, _ in topology.nodes() if n.startswith("a")]

    def start(node: str, argv: list[str]) -> RelayProcess:
        return RelayProcess(argv, prefix=[*net.exec(node), str(BIN / "python")], log=where / f"naive-{node}.log",
                            name=node, module="bench.wan.naive",
                            env=dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[2])))

    relays = [start("learner", ["origin", "--file", str(file), "--listen", f"127.0.0.1:{HUB_PORT}"])]
    parent_of = {}
    for chain in plan(agents, n_chains):
        for k, node in enumerate(chain):
            parent_of[node] = ("learner", HUB_PORT) if k == 0 else (chain[k - 1], RELAY_PORT)
            relays.append(start(node, ["relay", "--size", str(size), "--listen", f"127.0.0.1:{RELAY_PORT}"]))
    procs.extend((f"agent-{r.name}" if r.name != "learner" else "learner", r.proc) for r in relays)
    try:
        published, done = _broadcast(net, relays, parent_of, timeout)
    finally:
        file.unlink(missing_ok=True)
    if any(e["sha256"] != digest for e in done.values()):
        raise RuntimeError(f"naive round {version}: a relay received other bytes than the origin's")
    return _installs(version, published, done)


def run_wire(topology: Topology, workdir: Path, *, size: int, chunk: int, part_bytes: int, rounds: int,
             buckets: bool = True, timeout: float = 120.0, load: str = "none", with_naive: bool = True) -> dict:
    """``rounds`` publications along the chains on fresh namespaces; the bench's row (``strategy`` 'wire-only').
    ``load`` (bench/wan/burn.py): 'none'; 'procs', a process spinning in pure Python beside each agent's relay (the
    cores shared); 'threads', a thread spinning in each agent relay's own process (the cores and the GIL shared, as
    with the agent's generation thread). ``with_naive``: each round also runs the naive relay (bench/wan/naive.py) on
    the same chains and links, its figures in the row beside ours (``naive_ratio``, ``ours_over_naive``)."""
    if load not in ("none", "procs", "threads"):
        raise ValueError(f"load must be none, procs or threads, not {load!r}")
    started = time.monotonic()
    workdir.mkdir(parents=True, exist_ok=True)
    with Net(topology) as net:
        stack = WanStack(net, workdir)
        procs: list = []
        sampler = cpu.CpuSampler(lambda: cpu.stack_sessions(stack.stack.procs)() | cpu.stack_sessions(procs)())
        sampler.start()
        try:
            stack.start_proxy("learner", [HUB_PORT], bulk=(HUB_PORT,))
            for node, _ in topology.nodes():
                if node.startswith("a"):
                    stack.start_proxy(node, [RELAY_PORT], bulk=(RELAY_PORT,))
                    if load == "procs":
                        stack.stack.start(f"load-{node}", *net.exec(node), str(BIN / "python"), "-m",
                                          "bench.wan.burn", "spin")
            time.sleep(1.0)  # the proxies listening
            done, naive = [], []
            for v in range(1, rounds + 1):  # ours and the naive relay alternate, each first in every other round
                for kind in (("ours", "naive") if v % 2 else ("naive", "ours")) if with_naive else ("ours",):
                    if kind == "ours":
                        done.append(run_round(net, workdir, v, size=size, chunk=chunk, part_bytes=part_bytes,
                                              n_chains=chains(topology), buckets=buckets, timeout=timeout,
                                              procs=procs, load=load))
                    else:
                        naive.append(run_naive_round(net, workdir, NAIVE_VERSIONS + v, size=size,
                                                     n_chains=chains(topology), timeout=timeout, procs=procs))
        finally:
            sampler.stop()
            stack.stop()
        nodes = {net.address(n): (n, link) for n, link in topology.nodes()}
    hop_list = report.hops(report.read_taps(stack.taps), nodes)
    snapshots = [{"version": d["version"], "published_at": _iso(d["published"]), "t_bcast": d["t_bcast_s"],
                  "manifest": {}} for d in done + naive]
    every = timeline.versions(snapshots, hop_list, samples=sampler.samples,
                              installed={d["version"]: d["installs_s"] for d in done + naive})
    versions = [r for r in every if r["version"] < NAIVE_VERSIONS]
    naive_versions = [r for r in every if r["version"] >= NAIVE_VERSIONS]
    (workdir / "timeline.txt").write_text("\n".join(timeline.lines(versions)) + "\n")
    bw = statistics.median(a.up_bps for a in topology.agents)
    t_bcast, t_all = (statistics.median(d[k] for d in done) for k in ("t_bcast_s", "t_all_s"))
    row = {"profile": topology.name, "strategy": "wire-only", "agents": len(topology.agents), "status": "completed",
           "m_bytes": size, "m_over_bw_s": size / bw, "t_bcast_s": t_bcast, "ratio": t_bcast * bw / size,
           "t_bcast_max_s": max(d["t_bcast_s"] for d in done), "t_all_s": t_all, "ratio_all": t_all * bw / size,
           "ratios": [d["t_bcast_s"] * bw / size for d in done], "publications": rounds, "timed": rounds,
           "all_installed": rounds, "chunk_bytes": chunk, "part_bytes": part_bytes, "buckets": buckets, "load": load,
           "from_fallback": sum(d["from_fallback"] for d in done), **report.hop_summary(hop_list),
           "timeline": timeline.summary(versions), "seconds": time.monotonic() - started, "logs": str(workdir)}
    if naive:
        row.update(naive_summary(naive, size=size, bw=bw, ours=done), naive_timeline=timeline.summary(naive_versions))
    (workdir / "results.json").write_text(json.dumps({"row": row, "rounds": done, "naive_rounds": naive,
                                                      "hops": hop_list, "timeline": every}, indent=1, default=str))
    return row


def naive_summary(naive: list[dict], *, size: int, bw: float, ours: list[dict]) -> dict:
    """The naive relay's figures beside ours: its median T_bcast/(M/Bw), each round's, and ours/naive (the medians'
    ratio, and each round's against the naive round beside it)."""
    t_naive = statistics.median(d["t_bcast_s"] for d in naive)
    t_ours = statistics.median(d["t_bcast_s"] for d in ours)
    return {"naive_t_bcast_s": t_naive, "naive_ratio": t_naive * bw / size,
            "naive_ratios": [d["t_bcast_s"] * bw / size for d in naive], "ours_over_naive": t_ours / t_naive,
            "ours_over_naive_rounds": [o["t_bcast_s"] / n["t_bcast_s"] for o, n in zip(ours, naive, strict=False)]}


def _iso(t: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(t, UTC).isoformat()

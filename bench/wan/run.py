"""One job on a WAN topology, start to finish, and its audit: what the CI test (tests/test_wan.py) and the bench
(bench/bench_wan.py) share. The audit is the fault suite's (bench/fault_audit.py): every accepted record trained
once, none lost, none trained twice, the largest staleness, the learner's bubble."""

from __future__ import annotations

import json
import re
import statistics
import sys
import time
from pathlib import Path

from .netns import Net
from .profile import Topology
from .stack import Job, WanStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fault_audit as fa  # noqa: E402

INSTALLED = (re.compile(r"installed snapshot v(\d+) of job \d+ \(([\d.]+) ?s after publication"),
             re.compile(r"\bv(\d+) installed ([\d.]+) ?s after publication"))  # the agent's line, its status line


def installs(logs: Path) -> dict[int, list[float]]:
    """Each version's install latencies (seconds after publication), one per agent that installed it, from the
    agents' logs: what T_bcast is for every worker, where the site's stops at 1/gamma of them."""
    out: dict[int, list[float]] = {}
    for log in sorted(logs.glob("agent-*.log")):
        text, seen = log.read_text(errors="replace"), {}
        for pattern in INSTALLED:
            for match in pattern.finditer(text):
                seen.setdefault(int(match.group(1)), float(match.group(2)))
        for version, latency in seen.items():
            out.setdefault(version, []).append(latency)
    return out


def broadcast_figures(snapshots: list[dict], bw_bps: float, installed: dict[int, list[float]], agents: int) -> dict:
    """The full publications after the base (v >= 1, not deltas): M (bytes), M/Bw (Bw the worker link, bytes/s),
    the site's T_bcast (1/gamma of workers installed; median, worst) and T_all (every agent installed; median)."""
    full = [s for s in snapshots if s["version"] >= 1 and not s["manifest"].get("base_version")]
    timed = [s["t_bcast"] for s in full if s.get("t_bcast") is not None]
    every = [max(installed[s["version"]]) for s in full if len(installed.get(s["version"], [])) >= agents]
    m_bytes = statistics.median(int(s["manifest"].get("total_bytes", 0)) for s in full) if full else None
    m_over_bw = m_bytes / bw_bps if m_bytes else None
    t_bcast, t_all = (statistics.median(timed) if timed else None), (statistics.median(every) if every else None)
    return {"publications": len(full), "timed": len(timed), "all_installed": len(every), "m_bytes": m_bytes,
            "m_over_bw_s": m_over_bw, "t_bcast_s": t_bcast, "t_bcast_max_s": max(timed, default=None),
            "ratio": t_bcast / m_over_bw if t_bcast and m_over_bw else None, "t_all_s": t_all,
            "ratio_all": t_all / m_over_bw if t_all and m_over_bw else None}


def run_job(topology: Topology, workdir: Path, job: Job, *, timeout: float = 300.0) -> dict:
    """Build the namespaces, launch the stack, run ``job`` to its end, audit it, tear everything down."""
    started = time.monotonic()
    with Net(topology) as net:
        stack = WanStack(net, workdir, job)
        try:
            stack.launch_site()
            stack.launch_agents()
            stack.launch_job()
            status = stack.wait(timeout)
            found = stack.results()
        finally:
            stack.stop()
    aof = workdir / "redis" / "appendonlydir"
    from dataplane.replay import trajectories_key

    stream = fa.stream_audit(fa.aof_commands(aof), trajectories_key(stack.job_id)) if aof.exists() else None
    row = {"profile": topology.name, "agents": len(topology.agents), "status": status,
           "steps": found["summary"]["step"], **fa.audit(found["metrics"], found["summary"], stream, job.group),
           **broadcast_figures(found["snapshots"], statistics.median(a.up_bps for a in topology.agents),
                               installs(stack.stack.logs), len(topology.agents)),
           "seconds": time.monotonic() - started, "logs": str(stack.stack.logs)}
    (workdir / "results.json").write_text(json.dumps({"row": row, **found}, indent=1, default=str))
    return row

"""One job on a WAN topology, start to finish, and its audit: what the CI test (tests/test_wan.py) and the bench
(bench/bench_wan.py) share. The audit is the fault suite's (bench/fault_audit.py): every accepted record trained
once, none lost, none trained twice, the largest staleness, the learner's bubble."""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

from .netns import Net
from .profile import Topology
from .stack import Job, WanStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fault_audit as fa  # noqa: E402


def broadcast_figures(snapshots: list[dict], bw_bps: float) -> dict:
    """T_bcast of each publication after the base (v >= 1) against M/Bw: M the snapshot's bytes, Bw the worker
    link in bytes/s."""
    rows = [(s["version"], s["t_bcast"], int(s["manifest"].get("total_bytes", 0))) for s in snapshots
            if s["version"] >= 1 and s.get("t_bcast") is not None]
    if not rows:
        return {"publications": 0, "t_bcast_s": None, "m_bytes": None, "ratio": None}
    m_bytes = statistics.median(m for _, _, m in rows)
    t_bcast = statistics.median(t for _, t, _ in rows)
    return {"publications": len(rows), "t_bcast_s": t_bcast, "m_bytes": m_bytes,
            "m_over_bw_s": m_bytes / bw_bps, "ratio": t_bcast / (m_bytes / bw_bps) if m_bytes else None,
            "t_bcast_max_s": max(t for _, t, _ in rows)}


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
           **broadcast_figures(found["snapshots"], min(a.up_bps for a in topology.agents)),
           "seconds": time.monotonic() - started, "logs": str(stack.stack.logs)}
    return row

"""One job on a WAN topology, start to finish, and its audit: what the CI test (tests/test_wan.py) and the bench
(bench/bench_wan.py) share. The audit is the fault suite's (bench/fault_audit.py): every accepted record trained
once, none lost, none trained twice, the largest staleness, the learner's bubble."""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
import time
from pathlib import Path

from dataplane.broadcast.framing import DEFAULT_PART_BYTES

from . import cpu, report, timeline
from .faults import FaultPlan, Faults
from .netns import Net
from .profile import Topology
from .stack import PRICE, Job, WanStack

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fault_audit as fa  # noqa: E402

INSTALLED = (re.compile(r"installed snapshot v(\d+) of job \d+ \(([\d.]+) ?s after publication"),
             re.compile(r"\bv(\d+) installed ([\d.]+) ?s after publication"))  # the agent's line, its status line


def installs(logs: Path) -> dict[int, list[float]]:
    """Each version's install latencies (seconds after publication), one per agent that installed it, from the
    agents' logs: what T_bcast is for every worker, where the site's stops at 1/gamma of them."""
    out: dict[int, list[float]] = {}
    for install in installs_by_agent(logs):
        out.setdefault(install["version"], []).append(install["seconds"])
    return out


def installs_by_agent(logs: Path) -> list[dict]:
    """Each agent's install of each version: ``{"version", "node", "seconds"}`` (seconds after publication, from its
    log; the node's name from the log's, ``agent-a0.log``: a0), what bench/sim_wan.py times an install against."""
    out = []
    for log in sorted(logs.glob("agent-*.log")):
        text, seen = log.read_text(errors="replace"), {}
        for pattern in INSTALLED:
            for match in pattern.finditer(text):
                seen.setdefault(int(match.group(1)), float(match.group(2)))
        out += [{"version": v, "node": log.stem.removeprefix("agent-"), "seconds": t} for v, t in sorted(seen.items())]
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


def run_job(topology: Topology, workdir: Path, job: Job, *, timeout: float = 300.0,
            faults: FaultPlan | None = None, emulation: str = "proxy") -> dict:
    """Build the namespaces, launch the stack, run ``job`` to its end (with ``faults``: the fault script beside it,
    after the clean part), audit it, tear everything down. The broadcast figures and the bubble are the clean
    part's (before the first fault); the audit covers the whole job. ``emulation``: who adds the links' delay,
    jitter and loss, "netem" or "proxy" (bench/wan/netns.py ``choose_emulation``)."""
    started = time.monotonic()
    script = None
    with Net(topology, emulation=emulation) as net:
        stack = WanStack(net, workdir, job)
        sampler = cpu.CpuSampler(cpu.stack_sessions(stack.stack.procs)).start()
        try:
            stack.launch_site()
            stack.launch_agents()
            stack.launch_job()
            if faults is not None:
                script = Faults(stack, faults)
                script.start()
            status = stack.wait(timeout)
            found = stack.results()
        finally:
            if script is not None:
                script.stop()
            sampler.stop()
            stack.stop()
        nodes = {net.address(n): (n, link) for n, link in topology.nodes()}
    aof = workdir / "redis" / "appendonlydir"
    from dataplane.replay import trajectories_key

    stream = fa.stream_audit(fa.aof_commands(aof), trajectories_key(stack.job_id)) if aof.exists() else None
    events = script.events if script is not None else {}
    clean_until = script.first_fault if script is not None else math.inf
    clean = {"snapshots": [s for s in found["snapshots"] if report.wall(s["published_at"]) < clean_until],
             "metrics": [m for m in found["metrics"] if faults is None or m["step"] <= faults.after_step]}
    bubbles = [m["wait_s"] / (m["wait_s"] + m["t_train"]) for m in clean["metrics"] if m["wait_s"] + m["t_train"] > 0]
    full = [s for s in clean["snapshots"] if s["version"] >= 1 and not s["manifest"].get("base_version")]
    chunk = statistics.median(int(s["manifest"]["chunk_bytes"]) for s in full) if full else None
    taps = report.read_taps(stack.taps)
    agents = {a: n for a, (n, _) in nodes.items() if n.startswith("a")}
    hop_list = [h for h in report.hops(taps, nodes) if h["t0"] < clean_until]
    audit = fa.audit(found["metrics"], found["summary"], stream, job.group)
    row = {"profile": topology.name, "strategy": job.strategy, "agents": len(topology.agents), "status": status,
           "link_emulation": emulation,
           "steps": found["summary"]["step"], **audit, "bubble_all": audit["bubble"],
           "bubble": statistics.fmean(bubbles) if bubbles else None,
           **broadcast_figures(clean["snapshots"], statistics.median(a.up_bps for a in topology.agents),
                               installs(stack.stack.logs), len(topology.agents)),
           "chunk_bytes": chunk, **report.hop_summary(hop_list),
           "reply_ms": report.reply_latency(taps, until=clean_until),
           "reply_ms_all": report.reply_latency(taps), "reconnects": report.reconnects(taps, agents),
           "reconnect_lines": report.agent_reconnect_lines(stack.stack.logs),
           "timeouts": report.timeouts(stack.stack.logs),
           "faults": report.recovery(events, taps, found["snapshots"], aof, stack.job_id, agents) if faults else {},
           "fault_error": script.error if script is not None else None,
           "seconds": time.monotonic() - started, "logs": str(stack.stack.logs)}
    versions = timeline.versions(clean["snapshots"], hop_list, samples=sampler.samples,
                                 installed=installs(stack.stack.logs))
    row["timeline"] = timeline.summary(versions)
    (workdir / "timeline.txt").write_text("\n".join(timeline.lines(versions)) + "\n")
    if row["m_bytes"] and chunk:
        row.update(report.predicted_t_bcast(topology, job.strategy, size=row["m_bytes"], chunk=chunk))
    row["calibration"] = calibration(stack, clean, aof, clean_until) | {"chunk_bytes": chunk,
                                                                          "part_bytes": DEFAULT_PART_BYTES,
                                                                          "timeline": carried_timeline(versions)}
    (workdir / "results.json").write_text(json.dumps({"row": row, "hops": hop_list, "events": events,
                                                     "timeline": versions, "cpu_samples": sampler.samples, **found},
                                                     indent=1, default=str))
    return row


def carried_timeline(versions: list[dict]) -> list[dict]:
    """bench/wan/timeline.py's versions without the CPU figures: each publication's wall time, the site's t_bcast,
    the installs and every hop's first and last byte (what bench/sim_wan.py measures the relays' lag on)."""
    hop_keys = ("parent", "child", "first_s", "last_s", "link_mbit_s", "mbit_s")
    return [{"version": v["version"], "published": v["published"], "t_bcast_s": v["t_bcast_s"],
             "installs_s": v["installs_s"], "hops": [{k: h.get(k) for k in hop_keys} for h in v["hops"]]}
            for v in versions]


def calibration(stack: WanStack, clean: dict, aof: Path, until: float) -> dict:
    """The clean part in bench/sim_real.py's document shape, what bench/bench_simulator.py calibrates the fleet
    simulator on (plus ``links``: each worker's link, for the broadcast the simulator predicts), and what
    bench/sim_wan.py measures the run's processes on, so that a row is enough without its run's directory: each
    step's ``timing`` and ``created_at``, each publication's ``published_at``, each agent's install (``installed``)
    and, added by :func:`run_job`, the ``timeline``."""
    import sim_real

    job, topology = stack.job, stack.net.topology
    samples = [s for s in stack.samples if s[0] < until]
    sampled = max((s[2] for s in samples), default=0)  # the fault script may see the last clean step before a poll
    groups = sim_real.lease_groups(aof, stack.job_id) if aof.exists() else []
    sizes = [int(s["manifest"]["total_bytes"]) for s in clean["snapshots"] if s["version"] >= 1]
    links = dict(topology.nodes())
    return {"job": {"staleness": job.staleness, "batch": job.batch, "group": job.group, "steps": job.steps,
                    "kappa": job.staleness - 1, "price_per_hour": PRICE, "snapshot_bytes": max(sizes, default=None),
                    "strategy": job.strategy},
            "metrics": [{**{k: m.get(k) for k in ("step", "t_train", "wait_s", "max_staleness", "created_at")},
                         "timing": (m.get("extra") or {}).get("timing")}
                        for m in clean["metrics"] if m["step"] <= sampled],
            "samples": samples,
            "snapshots": [{k: s.get(k) for k in ("version", "t_bcast", "published_at")} for s in clean["snapshots"]],
            "installs": [{"seconds": t} for ts in installs(stack.stack.logs).values() for t in ts],
            "installed": installs_by_agent(stack.stack.logs),
            "groups": [g for g in groups if g["leased_ms"] / 1000 < until],
            "top_ups": [t for t in (sim_real.top_ups(aof, stack.job_id) if aof.exists() else []) if t / 1000 < until],
            "links": {str(w): vars(links[node]) for node, w in stack.workers.items()},
            "b0_bps": topology.learner.up_bps, "site_rtt_ms": topology.site.rtt_ms,
            "learner_rtt_ms": topology.learner.rtt_ms}

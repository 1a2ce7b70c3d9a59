"""The real stack's side of bench/bench_simulator.py: one fault-free job on a fresh live stack (bench_faults's
``none`` run: Redis, daphne, Celery, three relaying agents, ``echo2-learner``, the tiny arithmetic model), and
what the simulator is calibrated on and compared with, saved as one JSON document:

- ``metrics``: every learner step's ``t_train``, ``wait_s``, staleness histogram (the site's step reports);
- ``samples``: the bench's polls of the job summary, ``(t, status, step, accepted_records)``;
- ``workers``: the active workers at the end, with the site's measured throughput ``mu_i`` and price;
- ``snapshots``: every publication's measured ``T_bcast`` (the site's: until the installs were reported);
- ``installs``: every install the agents logged, seconds after publication;
- ``top_ups``: when the learner added prompts (ms), near the start of every step: the steps' durations;
- ``job``: ``S``, ``R``, ``n``, ``kappa``, steps, the snapshot's size;
- ``groups``: every returned group's worker, lease and return times (ms), read back from Redis' append-only
  file (the lease's ``XCLAIM ... TIME`` and the trajectory entry's id): the workers' own generation times,
  free of the backpressure that caps what the site measures as their throughput.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_faults as bf  # noqa: E402
import fault_audit as fa  # noqa: E402

SNAPSHOT_BYTES = re.compile(rb"published v\d+ \(\w+, (\d+) bytes\)")
INSTALLED = re.compile(rb"installed snapshot v(\d+) of job \d+ \(([\d.]+)s after publication")


class CalibrationRun(bf.Run):
    """bench_faults's fault-free run, keeping the per-step reports and polls that its row summarises away."""

    def report(self, started: float) -> dict:
        with self.owner() as api:
            metrics = api.get(f"jobs/{self.job_id}/metrics/").raise_for_status().json()
            summary = api.get(f"jobs/{self.job_id}/summary/").raise_for_status().json()
            live = api.get(f"jobs/{self.job_id}/live/").raise_for_status().json()
        metrics = metrics.get("results", metrics) if isinstance(metrics, dict) else metrics
        return {
            "job": {"staleness": bf.STALENESS, "batch": bf.BATCH, "group": bf.GROUP, "steps": self.args.steps,
                    "kappa": bf.STALENESS - 1, "price_per_hour": bf.PRICE},
            "summary": summary,
            "metrics": [{k: m.get(k) for k in ("step", "t_train", "wait_s", "max_staleness")}
                        | {"staleness_histogram": (m.get("extra") or {}).get("staleness_histogram", {})}
                        for m in metrics],
            "samples": [[s.t, s.status, s.step, s.accepted_records] for s in self.samples],
            "workers": [{"id": w["id"], "throughput": w["throughput"], "price_per_hour": w["price_per_hour"]}
                        for w in live["workers"]],
            "snapshots": live["snapshots"],
            "seconds": time.monotonic() - started,
        }


def real_run(*, steps: int, workdir: Path, seed: int = 0, run_timeout: float = 600.0) -> dict:
    """One fault-free job on a fresh stack; the JSON document of this module's docstring."""
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed (apt-get install redis-server)")
    args = argparse.Namespace(steps=steps, seed=seed, run_timeout=run_timeout, outage=0.0, workdir=workdir,
                              keep_logs=False, json=None)
    shutil.rmtree(workdir, ignore_errors=True)
    setup = bf.prepare(workdir.resolve(), args)
    run = CalibrationRun(setup, bf.FAULTS["none"])
    started = time.monotonic()
    try:
        run.launch()
        run.watch()
        doc = run.report(started)
    finally:
        run.stop()
    doc["groups"] = lease_groups(run.dir / "redis" / "appendonlydir", run.job_id)
    doc["top_ups"] = top_ups(run.dir / "redis" / "appendonlydir", run.job_id)
    sizes = [int(m) for m in SNAPSHOT_BYTES.findall((run.stack.logs / "learner.log").read_bytes())]
    doc["job"]["snapshot_bytes"] = sizes[-1] if sizes else None
    doc["installs"] = agent_installs(run.stack.logs)
    return doc


def agent_installs(logs: Path) -> list[dict]:
    """Every install an agent logged: ``{"agent", "version", "seconds"}`` after publication (its own clock)."""
    return [{"agent": path.stem, "version": int(v), "seconds": float(t)} for path in sorted(logs.glob("agent-*.log"))
            for v, t in INSTALLED.findall(path.read_bytes())]


def top_ups(aof: Path, job_id: int) -> list[int]:
    """Times (ms) the learner added prompts: its top-ups, one at the start of nearly every step."""
    prompts = f"echo2:job:{job_id}:prompts".encode()
    return sorted({int(cmd[2].split(b"-")[0]) for cmd in fa.aof_commands(aof)
                   if cmd[0].upper() == b"XADD" and cmd[1] == prompts})


def lease_groups(aof: Path, job_id: int) -> list[dict]:
    """Each returned group: ``{"worker", "leased_ms", "returned_ms"}``, from the replayed append-only file."""
    prompts, trajectories = f"echo2:job:{job_id}:prompts".encode(), f"echo2:job:{job_id}:trajectories".encode()
    leased: dict[bytes, int] = {}
    out = []
    for cmd in fa.aof_commands(aof):
        name = cmd[0].upper()
        if name == b"XCLAIM" and cmd[1] == prompts and b"TIME" in cmd:
            leased[cmd[5]] = int(cmd[cmd.index(b"TIME") + 1])
        elif name == b"XADD" and cmd[1] == trajectories:
            fields = dict(zip(cmd[3::2], cmd[4::2], strict=False))
            lease = fields.get(b"lease_id")
            if lease in leased:
                out.append({"worker": int(fields.get(b"worker_id", b"0")), "leased_ms": leased[lease],
                            "returned_ms": int(cmd[2].split(b"-")[0])})
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--out", type=Path, default=Path("var/sim-real.json"))
    parser.add_argument("--workdir", type=Path, default=Path("var/sim-real"))
    a = parser.parse_args()
    doc = real_run(steps=a.steps, workdir=a.workdir)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(doc, indent=1))
    print(f"{len(doc['metrics'])} steps in {doc['seconds']:.0f} s -> {a.out}")

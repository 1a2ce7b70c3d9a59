"""A fleet-bench row that runs a job to its end (``--job-steps``): N emulated agents plus real ``echo2-agent run``
processes on the tiny model, the real learner (no drain), optionally a fault (a site restart, a Redis restart) once
the learner passed a quarter of the steps; then the audit of every group.

- completed: the job's status at its end (the bench waits while the learner makes steps: each step gives it
  ``--job-timeout`` more seconds, at most 4 x that in all);
- lost / trained twice / max lag: ``bench/fault_audit.py``'s audit of the learner's step reports against the
  trajectory stream replayed from the private Redis' append-only file (only judged once the job ended);
- resends: requests the agents sent again under an id still unanswered (the probe), and requests the site answered
  from their kept verdict instead of running them again (``marketplace.infra.verdicts.RESENT_KEY``);
- told accepted = stored: the groups the emulated agents were told were accepted against the groups the site
  appended to the stream from them (the AOF's ``XADD`` fields ``lease_id``, ``worker_id``), both ways, and groups
  appended twice.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections import Counter
from pathlib import Path

from . import report
from .rows import JOB_FIELDS, Row, _django
from .site import BIN

FINAL = ("completed", "failed", "cancelled")
FAULTS = ("site-restart", "redis-restart")


def stored_groups(commands, key: str | None = None) -> list[tuple[str, int]]:
    """(lease id, worker id) of every group appended to the trajectory stream ``key`` (None: every job's), from AOF
    commands, oldest first."""
    out = []
    for args in commands:
        if args[0].upper() != b"XADD" or len(args) < 2 or not (
                args[1] == key.encode() if key else args[1].endswith(b":trajectories")):
            continue
        fields = dict(zip(args[3::2], args[4::2], strict=False))  # XADD key id field value ...
        lease, worker = fields.get(b"lease_id"), fields.get(b"worker_id")
        if lease is not None:
            out.append((lease.decode(), int(worker) if worker is not None else 0))
    return out


def verdict_audit(told: set[str], stored: list[tuple[str, int]], emulated: set[int],
                  everywhere: list[tuple[str, int]] | None = None) -> dict:
    """Told accepted against stored: groups told accepted and stored in no job's stream (``everywhere``: every
    job's groups; an agent may have worked for an earlier job still running), groups of this job's stream
    (``stored``) from an emulated agent that was never told (a verdict it did not get), and lease ids stored
    twice."""
    counts = Counter(lease for lease, _ in stored)
    anywhere = {lease for lease, _ in (everywhere if everywhere is not None else stored)}
    mine = {lease for lease, worker in stored if worker in emulated}
    return {"told_accepted": len(told), "stored": len(counts), "stored_emulated": len(mine),
            "told_elsewhere": len((told - set(counts)) & anywhere), "told_not_stored": len(told - anywhere),
            "stored_not_told": len(mine - told), "stored_twice": sum(n - 1 for n in counts.values() if n > 1)}


class JobRow(Row):
    """One job to its end under the fleet, with ``fault`` (one of :data:`FAULTS`) or none."""

    def __init__(self, site, args, *, n: int, processes: int, tag: str, fault: str = "") -> None:
        super().__init__(site, args, n=n, processes=processes, tag=tag)
        self.fault = fault
        self.figures.update({"fault": fault or "none", "real_agents": len(site.real), "hog": bool(args.hog)})
        self.real_procs: list[subprocess.Popen] = []
        self.events: list[str] = []

    def _run(self) -> None:
        from marketplace.infra import verdicts

        _django(self.site)
        self.resent0 = sum(verdicts.resent_counts().values())
        servers = self._connect_fleet()
        api = self.site.api(servers[-1])
        fields = dict(JOB_FIELDS(self.args, self.site), name=f"fleet job {self.tag}", max_steps=self.args.job_steps,
                      batch_trajectories=self.args.job_batch)
        self.job_id = api.post("jobs/", json=fields).raise_for_status().json()["id"]
        self.t_start = time.time()
        api.post(f"jobs/{self.job_id}/start/").raise_for_status()
        self.learner = self.site.start_learner(f"learner-{self.tag}", servers[-1], self.job_id)
        self.started.append(self.learner)
        self._follow(api)
        self._audit(api)
        if self.figures.get("status") not in FINAL:  # what the owner would do: a job left running takes the
            api.post(f"jobs/{self.job_id}/cancel/", timeout=60)  # next row's agents (one job per worker at a time)
            self.figures["cancelled_by_bench"] = True

    def _connect_fleet(self) -> list[str]:
        """daphne processes, the emulated fleet and the real agents, all connected; returns the site's URLs."""
        from worker_agent.config import AgentConfig

        site, args, n = self.site, self.args, self.n
        daphnes = site.start_daphnes(self.processes, self.tag)
        self.daphnes = [proc for _, proc in daphnes]
        self.ports = [int(url.rsplit(":", 1)[1]) for url, _ in daphnes]
        servers = [url for url, _ in daphnes]
        k = max(1, min(args.agent_processes, n))
        for p in range(k):
            name = f"agents-{self.tag}-{p}"
            spec = {"agents": [dict(w, server=servers[i % len(servers)]) for i, w in enumerate(site.workers[:n])
                               if i % k == p],
                    "tokens_per_s": args.tokens_per_s, "groups_per_lease": args.groups_per_lease,
                    "cache_dir": str(site.workdir / f"cache-{p}"), "model_dir": str(site.model_dir),
                    "progress": str(site.workdir / f"{name}.progress"), "out": str(site.workdir / f"{name}.out")}
            self.specs.append(spec)
            self.agent_procs.append(site.start_agents(name, spec))
        for i, w in enumerate(site.real):
            cfg = site.workdir / f"real-{self.tag}-{i}.json"
            AgentConfig(server=servers[i % len(servers)], worker_id=w["worker_id"], name=w["name"],
                        agent_key=w["agent_key"]).save(cfg)
            self.real_procs.append(site.stack.start(f"real-{self.tag}-{i}", str(BIN / "echo2-agent"), "run",
                                                    "--config", str(cfg), "--threads", "1"))
        self.figures["connect_s"] = self._settle("welcomed", n, timeout=60 + 0.3 * n)
        self.figures["connected"] = self._progress()["welcomed"]
        return servers

    def _inject(self) -> None:
        t = time.time()
        if self.fault == "site-restart":
            for proc in self.daphnes:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(10)
            self.site.stack.procs = [(n, p) for n, p in self.site.stack.procs if p not in self.daphnes]
            self.started = [p for p in self.started if p not in self.daphnes]
            daphnes = self.site.start_daphnes(self.processes, f"{self.tag}-restarted", ports=self.ports)
            self.daphnes = [proc for _, proc in daphnes]
            self.started += self.daphnes
            self.events.append(f"SIGKILL of {self.processes} daphne, answering again after {time.time() - t:.1f} s")
        elif self.fault == "redis-restart":
            away = self.site.restart_redis()
            self.events.append(f"SIGKILL of Redis, answering again after {away:.1f} s")
        self.figures["injected_after_s"] = t - self.t_start

    def _follow(self, api) -> None:
        """Poll the job until it ends, the fault injected at a quarter of the steps; the deadline follows progress."""
        timeout, start = self.args.job_timeout, time.monotonic()
        deadline, step, injected = start + timeout, -1, not self.fault
        while time.monotonic() < deadline:
            try:
                summary = api.get(f"jobs/{self.job_id}/summary/", timeout=10).raise_for_status().json()
            except Exception:  # noqa: BLE001 - the site restarting, or slow: the next poll
                time.sleep(1.0)
                continue
            self.status = summary["status"]
            if (summary["step"] or 0) > step:
                step = summary["step"] or 0
                deadline = min(max(deadline, time.monotonic() + timeout / 2), start + 4 * timeout)
            if not injected and step >= max(1, self.args.job_steps // 4):
                injected = True
                self._inject()
            if self.status in FINAL:
                break
            time.sleep(1.0)
        self.figures["job_s"] = time.time() - self.t_start
        self.figures["steps"] = step

    def _audit(self, api) -> None:
        from bench import fault_audit as fa
        from dataplane.replay import trajectories_key
        from marketplace.infra import verdicts

        summary = api.get(f"jobs/{self.job_id}/summary/", timeout=30).raise_for_status().json()
        metrics = api.get(f"jobs/{self.job_id}/metrics/", timeout=30).raise_for_status().json()
        self.figures["status"], self.figures["status_reason"] = summary["status"], summary.get("status_reason")
        self.figures["resent_site"] = sum(verdicts.resent_counts().values()) - self.resent0
        self.figures["counters"] = summary.get("counters") or {}
        aof = self.site.workdir / "redis" / "appendonlydir"
        time.sleep(1.5)  # appendfsync everysec
        stream = fa.stream_audit(fa.aof_commands(aof), trajectories_key(self.job_id)) if aof.exists() else None
        audit = fa.audit(metrics, summary, stream, self.args.group_size)
        if summary["status"] not in FINAL:
            audit["notes"].append(f"the job had not ended: {audit['lost'] // self.args.group_size} groups in flight")
            audit["lost"] = None
        self.figures["audit"] = audit
        self._stored = stored_groups(fa.aof_commands(aof), trajectories_key(self.job_id)) if aof.exists() else None
        self._stored_all = stored_groups(fa.aof_commands(aof)) if aof.exists() else None

    def _stop(self) -> None:
        for proc in self.real_procs:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        super()._stop()
        for proc in self.real_procs:
            try:
                proc.wait(15)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        self.site.stack.procs = [(n, p) for n, p in self.site.stack.procs if p not in self.real_procs]
        summaries = []
        for spec in self.specs:
            try:
                summaries.append(json.loads(Path(spec["out"]).read_text()))
            except (OSError, ValueError):
                continue
        if not summaries:
            return
        fleet = report.merge(summaries)
        self.figures["resent_agents"] = sum(s.get("resent", 0) for s in summaries)
        self.figures["refused"] = len(fleet["rejections"])
        self.figures["refused_why"] = {f"{kind}: {why}": count for (kind, why), count
                                       in report.refusals(fleet["rejections"], 0, time.time()).most_common(3)}
        if getattr(self, "_stored", None) is not None:
            emulated = {w["worker_id"] for w in self.site.workers[:self.n]}
            self.figures["verdicts"] = verdict_audit(set(fleet["accepted"]), self._stored, emulated, self._stored_all)
        self.figures["events"] = self.events


def passes(fig: dict) -> list[str]:
    """Why a job row fails (empty: it passes): the job completed, 0 lost, 0 trained twice, every verdict right."""
    audit, v = fig.get("audit") or {}, fig.get("verdicts") or {}
    checks = [(fig.get("status") == "completed", f"job {fig.get('status')}"),
              (fig.get("fault", "none") == "none" or "injected_after_s" in fig, "the fault was never injected"),
              (audit.get("lost") == 0, f"{audit.get('lost')} records lost"),
              (audit.get("trained_twice") == 0, f"{audit.get('trained_twice')} records trained twice"),
              (bool(v) and v["told_not_stored"] == 0 and v["stored_twice"] == 0,
               f"{v.get('told_not_stored')} told accepted not stored, {v.get('stored_twice')} stored twice"),
              (bool(v) and v["stored_not_told"] == 0, f"{v.get('stored_not_told')} stored never told accepted")]
    return [why for ok, why in checks if not ok]


def markdown(rows: list[JobRow]) -> str:
    """The job rows as a Markdown table (docs/fleet.md), one line per row."""
    head = ("agents (+real) x site processes", "fault", "job", "steps (s)", "lost", "trained twice", "max lag",
            "resent: agents / answered from kept verdict", "told accepted / stored (emulated) / in another job / "
            "not stored / stored twice", "refused", "verdict")
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for r in rows:
        f, a, v = r.figures, r.figures.get("audit") or {}, r.figures.get("verdicts") or {}
        fault = f["fault"] + (" (never injected)" if f["fault"] != "none" and "injected_after_s" not in f else "")
        cells = (f"{f['agents']} (+{f['real_agents']}) x {f['site_processes']}", fault, str(f.get("status")),
                 f"{f.get('steps')} ({f.get('job_s', 0):.0f})", str(a.get("lost")), str(a.get("trained_twice")),
                 str(a.get("max_staleness")), f"{f.get('resent_agents')} / {f.get('resent_site')}",
                 f"{v.get('told_accepted')} / {v.get('stored_emulated')} / {v.get('told_elsewhere')} / "
                 f"{v.get('told_not_stored')} / {v.get('stored_twice')}", str(f.get("refused")),
                 "PASS" if not passes(f) else "FAIL: " + "; ".join(passes(f)))
        lines.append("| " + " | ".join(c.replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"

"""One row of the fleet bench: a fleet of N agents on P site processes, measured through one job's life."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

from worker_agent.timing import REPLY_CEILING_S

from . import report
from .drain import Drain
from .site import Site, cpu_seconds, machine_cpu, stop_process

# The longest an agent waits for the site's reply to one request before it sends it again. It is no longer a fixed
# 30 s: each agent derives it from the round trips it measured (worker_agent/timing.py ``RoundTrips.reply_timeout``:
# 4 x RTO, between REPLY_FLOOR_S and REPLY_CEILING_S; REPLY_UNMEASURED_S before its first sample), per agent and
# changing over the run. The bench cannot read each agent's figure, so its "lost" cut-off takes the most any agent
# can use: a lease older than this at the release had time to come back (or be handed back) under every agent's
# timeout, so one still missing was lost by the transport, not caught mid-retry by the release.
REPLY_TIMEOUT_S = REPLY_CEILING_S
_django_ready = False


def _django(site: Site) -> None:
    """The site's own readers in this process (heartbeat records, the scheduler), against the live stack."""
    global _django_ready
    if not _django_ready:
        os.environ.update(site.env)
        import django

        django.setup()
        _django_ready = True


def _site_refusals() -> int | None:
    """Frames the site refused over a connection's budget, all workers (``marketplace.infra.refusals``; None where the
    site does not count them)."""
    try:
        from marketplace.infra import refusals
    except ImportError:
        return None
    return sum(refusals.counts().values())


class Row:
    def __init__(self, site: Site, args, *, n: int, processes: int, tag: str) -> None:
        self.site, self.args, self.n, self.processes, self.tag = site, args, n, processes, tag
        self.figures: dict = {"agents": n, "site_processes": processes}
        self.started: list = []  # processes of this row, stopped at its end
        self.drain: Drain | None = None
        self.specs: list[dict] = []
        self.agent_procs: list = []
        self.t_row = time.time()

    def run(self) -> Row:
        try:
            self._run()
        finally:
            self._stop()
        return self

    def _progress(self) -> dict:
        total: dict = {"welcomed": 0, "assigned": 0, "released": 0, "installed0": 0, "rejected": 0}
        for spec in self.specs:
            try:
                p = json.loads(Path(spec["progress"]).read_text())
            except (OSError, ValueError):
                continue
            for key in ("welcomed", "assigned", "released", "rejected"):
                total[key] += p[key]
            total["installed0"] += p["installed"].get("0", 0)
        return total

    def _settle(self, key: str, goal: int, *, timeout: float, quiet_s: float = 15.0) -> float | None:
        """Seconds until ``goal`` agents reached ``key`` (None: the count stopped moving for ``quiet_s`` below it,
        or ``timeout`` passed)."""
        started = last_change = time.monotonic()
        last = -1
        while time.monotonic() - started < timeout:
            now, count = time.monotonic(), self._progress()[key]
            if count >= goal:
                return now - started
            if count != last:
                last, last_change = count, now
            elif count > 0 and now - last_change > quiet_s:
                return None
            self.site.wait(lambda: False, key, 0.3)  # checks that the stack's processes still run
        return None

    def _run(self) -> None:
        _django(self.site)
        refused0 = _site_refusals()
        servers = self._connect()
        api = self.site.api(servers[-1])  # job start and every learner request: through the last site process
        self._start_job(api, servers[-1])
        self._measure()
        self._time_replan()
        self._stop_drain()  # before the cancel, which drops the job's streams
        refused1 = _site_refusals()
        self.figures["site_refused"] = None if refused0 is None else refused1 - refused0
        self._release(api)

    def _connect(self) -> list[str]:
        """daphne processes, the fleet's processes (agents spread over the site processes by port), all welcomed,
        then ``--idle`` seconds of heartbeats alone; returns the site processes' URLs."""
        site, args, n = self.site, self.args, self.n
        daphnes = site.start_daphnes(self.processes, self.tag)
        self.daphnes = [proc for _, proc in daphnes]
        self.started += self.daphnes
        servers = [url for url, _ in daphnes]
        workers = site.workers[:n]
        k = max(1, min(args.agent_processes, n))
        for p in range(k):
            name = f"agents-{self.tag}-{p}"
            spec = {"agents": [dict(w, server=servers[i % len(servers)]) for i, w in enumerate(workers) if i % k == p],
                    "tokens_per_s": args.tokens_per_s, "groups_per_lease": args.groups_per_lease,
                    "cache_dir": str(site.workdir / f"cache-{p}"), "model_dir": str(site.model_dir),
                    "progress": str(site.workdir / f"{name}.progress"), "out": str(site.workdir / f"{name}.out")}
            self.specs.append(spec)
            self.agent_procs.append(site.start_agents(name, spec))
        self.started += self.agent_procs
        self.figures["connect_s"] = self._settle("welcomed", n, timeout=60 + 0.3 * n)
        self.figures["connected"] = self._progress()["welcomed"]
        t0, cpu0, pg0 = time.time(), sum(cpu_seconds(p.pid) for p in self.daphnes), site.pg.stats() if site.pg else None
        time.sleep(args.idle)
        t1, cpu1, pg1 = time.time(), sum(cpu_seconds(p.pid) for p in self.daphnes), site.pg.stats() if site.pg else None
        self.idle, self._idle_cost = (t0, t1), (cpu1 - cpu0, pg1["xacts"] - pg0["xacts"] if pg0 and pg1 else None)
        return servers

    def _start_job(self, api, server: str) -> None:
        """Create and start the job, start its learner (and the drain); wait until the agents the scheduler
        activated (all, unless it doubts some are available) have installed the base."""
        site, args = self.site, self.args
        job = api.post("jobs/", json=JOB_FIELDS(args, site)).raise_for_status().json()
        self.job_id = job["id"]
        self.t_start = time.time()
        api.post(f"jobs/{self.job_id}/start/").raise_for_status()
        self.learner = site.start_learner(f"learner-{self.tag}", server, self.job_id)
        self.started.append(self.learner)
        if args.drain:
            self.drain = Drain(site.redis(decode=False), job_id=self.job_id, task=JOB_FIELDS(args, site)["task"],
                               prompts=max(64, 4 * self.n * args.groups_per_lease)).start()
        self._settle("assigned", self.n, timeout=90)
        self.figures["base_installed_s"] = self._settle("installed0", self._progress()["assigned"], timeout=180)
        self.figures["first_group_s"] = self._first_group(timeout=60.0)
        time.sleep(2.0)  # the window opens on generation, not on the installs' tail

    def _first_group(self, *, timeout: float) -> float | None:
        """Seconds until the site accepted the job's first group (None: none in ``timeout``)."""
        from dataplane.replay import counters_key

        redis, started = self.site.redis(), time.monotonic()
        while time.monotonic() - started < timeout:
            if int(redis.hget(counters_key(self.job_id), "accepted_groups") or 0) > 0:
                return time.monotonic() - started
            self.site.wait(lambda: False, "the first group", 0.2)  # checks that the stack's processes still run
        return None

    def _measure(self) -> None:
        """``--window`` seconds of generation: the site's counters, CPU, database and the learner's log."""
        from dataplane.replay import counters_key

        site, fig = self.site, self.figures
        redis, counters = site.redis(), counters_key(self.job_id)
        log = site.stack.logs / f"learner-{self.tag}.log"

        def sample():
            return (time.time(), redis.hgetall(counters), sum(cpu_seconds(p.pid) for p in self.daphnes),
                    site.pg.stats() if site.pg else None, log.stat().st_size, machine_cpu(),
                    sum(cpu_seconds(p.pid) for p in self.agent_procs))

        (w0, c0, cpu0, pg0, log0, machine0, fleet0) = sample()
        time.sleep(self.args.window)
        (w1, c1, cpu1, pg1, log1, machine1, fleet1) = sample()
        fig["fleet_cpu_share"] = (fleet1 - fleet0) / (w1 - w0)  # the emulated agents' own CPU, in cores
        self.window, span = (w0, w1), w1 - w0
        fig["machine_busy"] = (machine1[0] - machine0[0]) / max(1, machine1[1] - machine0[1])
        for key in ("accepted_groups", "accepted_records"):
            fig[key.replace("accepted_", "") + "_per_s"] = (int(c1.get(key, 0)) - int(c0.get(key, 0))) / span
        fig["daphne_cpu_share"] = (cpu1 - cpu0) / span / self.processes  # of one core, per process
        self._cpu, self._pg = cpu1 - cpu0, (pg0, pg1)
        with log.open("rb") as f:
            f.seek(log0)
            fig["bubble"], fig["learner_steps"] = report.learner_bubble(f.read(log1 - log0).decode(errors="replace"))

    def _time_replan(self) -> None:
        """One re-plan decision of the running job over the whole pool (the scheduler's own function)."""
        from marketplace.models import Job
        from marketplace.reads import scheduling

        started = time.perf_counter()
        scheduling.job_replan(Job.objects.get(pk=self.job_id))
        self.figures["replan_s"] = time.perf_counter() - started

    def _release(self, api) -> None:
        """Cancel the job (every worker released), then read the site's heartbeat records of the fleet."""
        from marketplace.infra import telemetry

        self.t_cancel = time.time()
        self.figures["cancel_errors"] = []
        for _ in range(5):  # a 500 is a finding (the row says so); the owner would press Cancel again
            reply = api.post(f"jobs/{self.job_id}/cancel/")
            if reply.status_code < 500:
                reply.raise_for_status()
                break
            self.figures["cancel_errors"].append(reply.status_code)
            time.sleep(1.0)
        self._settle("released", self._progress()["assigned"], timeout=60)
        time.sleep(1.0)
        ids = [w["worker_id"] for w in self.site.workers[:self.n]]
        self.handled = {wid: [at for at, _ in beats] for wid, beats in telemetry.recent_heartbeats(ids).items()}

    def _stop_drain(self) -> None:
        if self.drain is not None:
            self.drain.stop()
            self.figures["drained"], self.figures["drain_error"] = self.drain.acknowledged, repr(self.drain.error)[:300]
            self.drain = None

    def _stop(self) -> None:
        agents = self.agent_procs
        for proc in agents:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + 30
        for proc in agents:
            with contextlib.suppress(Exception):  # stopped by force below
                proc.wait(max(0.1, deadline - time.monotonic()))
        self._stop_drain()
        for proc in reversed(self.started):
            stop_process(self.site.stack, proc)
        summaries = []
        for spec in self.specs:
            with contextlib.suppress(OSError, ValueError):
                summaries.append(json.loads(Path(spec["out"]).read_text()))
        if summaries and hasattr(self, "t_cancel"):  # the row reached its release: its figures are whole
            self._figures(report.merge(summaries))

    def _figures(self, fleet: dict) -> None:
        fig, (w0, w1) = self.figures, self.window
        for name, (start, end) in (("idle", self.idle), ("gen", self.window)):
            hb = report.heartbeat_lags(fleet["heartbeats"], getattr(self, "handled", {}), start, end)
            fig[f"hb_{name}"] = hb
        fig["hb_on_time_per_s"] = fig["hb_gen"]["on_time"] / (w1 - w0)
        beats = fig["hb_idle"]["sent"]  # nothing else is sent while idle: the cost of a heartbeat alone
        cpu, xacts = self._idle_cost
        fig["idle_cpu_ms_per_hb"] = 1000 * cpu / beats if beats else None
        fig["idle_xact_per_hb"] = xacts / beats if beats and xacts is not None else None
        fig["latency"] = report.reply_latencies(fleet["replies"], w0, w1)
        row_span = (self.t_row, self.t_cancel)  # after the release, a batch in flight is refused as expected
        fig["frames_received"] = dict(fleet["received"])
        fig["refused"] = sum(report.refusals(fleet["rejections"], *row_span).values())
        fig["refused_why"] = {f"{kind}: {why}": count  # str keys: the row is written as JSON
                              for (kind, why), count in report.refusals(fleet["rejections"], *row_span).most_common(5)}
        fig["lost"] = report.lost_groups(fleet, before=self.t_cancel - REPLY_TIMEOUT_S)
        fig["lost_checked"] = report.leased_before(fleet, before=self.t_cancel - REPLY_TIMEOUT_S)
        fig["lost_cutoff_s"] = REPLY_TIMEOUT_S
        fig["leases"] = len(fleet["leased"])
        fig["engine_groups_per_s"] = self.n * self.args.tokens_per_s / (self.args.group_size
                                                                        * self.args.completion_tokens)
        fig["activate_told"], fig["activate_s"] = report.push_spread(fleet["pushes"].get("assign", {}), self.t_start)
        fig["release_told"], fig["release_s"] = report.push_spread(fleet["pushes"].get("release", {}), self.t_cancel)
        fig["push"] = report.snapshot_fanout(fleet["snapshots"], w0, w1)
        messages = report.messages_in(fleet, w0, w1)
        fig["messages_per_s"] = messages / (w1 - w0)
        fig["cpu_ms_per_msg"] = 1000 * self._cpu / messages if messages else None
        groups = fig["groups_per_s"] * (w1 - w0)
        fig["cpu_ms_per_group"] = 1000 * self._cpu / groups if groups else None
        pg0, pg1 = self._pg
        if pg0 and pg1 and messages:
            fig["db_xact_per_msg"] = (pg1["xacts"] - pg0["xacts"]) / messages
            fig["db_rows_per_msg"] = (pg1["rows_read"] + pg1["rows_written"] - pg0["rows_read"]
                                      - pg0["rows_written"]) / messages


def JOB_FIELDS(args, site: Site) -> dict:  # noqa: N802 - a constant's shape, built from the arguments
    return {"name": "fleet bench", "model_dir": str(site.model_dir), "task": {"name": "arithmetic"}, "staleness": 3,
            "batch_trajectories": 128, "group_size": args.group_size, "max_new_tokens": args.completion_tokens,
            "learning_rate": 1e-3, "max_steps": 1_000_000}

"""One run of the fault suite (bench/bench_faults.py): a fresh stack, one job, one fault injected when its moment
comes, and the row that audits it."""

from __future__ import annotations

import json
import os
import shutil
import signal
import threading
import time
from collections.abc import Callable

import fault_audit as fa
import fault_bills as fb
import httpx
from fault_stack import BIN, PRICE, Setup, redis_argv, redis_up, site_env, site_up
from faults import Fault
from faults.base import BEAT_S, LEASE_TIMEOUT_S, WORKER_TIMEOUT_S

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for

STALENESS, BATCH, GROUP = 3, 32, 8
FINAL = ("completed", "failed", "cancelled")
TICK = 0.5
LOG_TICK = 0.05  # the logs are read this often: their lines are stamped when read, and recovery is timed by them
# A run's deadline follows its progress: each new step gives it half of --run-timeout more, up to this many times
# --run-timeout in all (on a loaded machine 5 of 9 rows missed a fixed 300 s while still training).
PROGRESS_CAP = 4


def fault_step(steps: int) -> int:
    """The learner step after which the fault is injected: early, so the job runs on long after it."""
    return max(20, steps // 8)


class Run:
    """One fault on one fresh stack: launch, watch and inject, audit."""

    def __init__(self, setup: Setup, fault: Fault) -> None:
        self.setup, self.fault, self.args = setup, fault, setup.args
        self.dir = setup.workdir / f"run-{fault.name}"
        self.dir.mkdir(parents=True)
        self.redis_port = free_port()
        self.stack = Stack(self.dir, site_env(self.dir, self.redis_port))
        self.argv: dict[str, tuple[str, ...]] = {}
        self.procs: dict[str, object] = {}
        self.frozen: set[str] = set()
        self.t0 = time.monotonic()
        self.wall0 = time.time()  # the site's records are in Unix time: wall0 + now() is the bench's clock in them
        self.samples: list[fa.Sample] = []
        self.live: dict = {}
        self.tail = fa.LogTail(self.stack.logs / "learner.log")
        self.victim_tail: fa.AgentLogTail | None = None  # a killed agent's log from its restart on
        self.events: list[tuple[float, str]] = []
        self.injected_at: float | None = None
        self.back_at: float | None = None  # the faulted component answering again (or restarted)
        self.victim: tuple[str, int | None] = ("", None)  # process name, worker id
        self.notes: list[str] = []
        self.job_id = 0
        self.player: threading.Thread | None = None
        self.ended = threading.Event()
        self.left: list[str] = []  # the fault's actions not done yet

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self, name: str, *argv: str) -> None:
        self.argv[name] = argv
        self.procs[name] = self.stack.start(name, *argv)

    def restart(self, name: str) -> None:
        self.procs[name] = self.stack.start(name, *self.argv[name])

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.procs[name]
        os.killpg(proc.pid, sig)
        if sig == signal.SIGKILL:
            proc.wait(10)
        (self.frozen.add if sig == signal.SIGSTOP else self.frozen.discard)(name)

    def owner(self) -> httpx.Client:
        return httpx.Client(base_url=self.setup.server + "/api/", timeout=5,
                            headers={"Authorization": f"Token {self.setup.tokens['owner']}"})

    def launch(self) -> None:
        """Redis, the site, Celery, the agents, the job and its learner."""
        shutil.copy(self.setup.workdir / "template" / "site.sqlite3", self.dir / "site.sqlite3")
        self.start("redis", *redis_argv(self.dir / "redis", self.redis_port))
        wait_for(lambda: redis_up(self.redis_port), "Redis", 20)
        self.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.setup.site_port),
                   *DAPHNE_WEBSOCKET_LIMITS, "echo2_site.asgi:application")
        self.start("celery-worker", str(BIN / "celery"), "-A", "echo2_site", "worker", "-l", "info", "-P", "solo")
        self.start("celery-beat", str(BIN / "celery"), "-A", "echo2_site", "beat", "-l", "info", "-s",
                   str(self.dir / "celerybeat-schedule"))
        wait_for(lambda: site_up(self.setup.server), "the site", 90)
        for name, (cfg, relay, _) in self.setup.agents.items():
            # --debug: every install's line (bench/sim_real.py reads them); at INFO only the base's and the status line
            self.start(f"agent-{name}", str(BIN / "echo2-agent"), "run", "--config", str(cfg), "--threads", "1",
                       "--relay-listen", relay, "--debug")
        provider = httpx.Client(base_url=self.setup.server + "/api/", timeout=10,
                                headers={"Authorization": f"Token {self.setup.tokens['provider']}"})
        wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"]) == 3,
                 "three idle workers", 120)
        with self.owner() as api:
            job = api.post("jobs/", json={
                "name": f"faults: {self.fault.name}", "model_dir": str(self.setup.model_dir),
                "task": {"name": "arithmetic", "max_operand": 4}, "staleness": STALENESS,
                "batch_trajectories": BATCH, "group_size": GROUP, "learning_rate": 1e-3,
                "max_steps": self.args.steps + self.fault.extra_steps, "max_new_tokens": 2, "seed": self.args.seed,
                "learner_uplink_bps": 12_500_000}).raise_for_status().json()  # = Bw: one chain of three
            self.job_id = job["id"]
            api.post(f"jobs/{self.job_id}/start/").raise_for_status()
        self.start("learner", str(BIN / "echo2-learner"), "--server", self.setup.server, "--job", str(self.job_id),
                   "--token", self.setup.tokens["owner"], "--redis", f"redis://127.0.0.1:{self.redis_port}/0",
                   "--snapshot-dir", str(self.dir / "snapshots"))

    def sample(self, api: httpx.Client) -> fa.Sample | None:
        try:
            summary = api.get(f"jobs/{self.job_id}/summary/").raise_for_status().json()
            self.live = api.get(f"jobs/{self.job_id}/live/").raise_for_status().json()
        except (httpx.HTTPError, ValueError):
            return None
        sample = fa.Sample(self.now(), summary["status"], summary["step"] or 0,
                           int(summary["counters"].get("accepted_records", 0)),
                           [w["id"] for w in self.live["workers"]], float(summary["cost_usd"]))
        self.samples.append(sample)
        return sample

    def read_logs(self) -> None:
        """On a thread of its own, until the run ends: the learner's log (and a restarted agent's) every LOG_TICK,
        whatever the site's answers cost the polling loop, so a line's stamp is within LOG_TICK of its writing."""
        while not self.ended.wait(LOG_TICK):
            self.tail.poll(self.now())
            if self.victim_tail is not None:
                self.victim_tail.poll(self.now())

    def watch(self) -> None:
        """Poll the site (the logs are read by :meth:`read_logs`); inject the fault when its moment comes; until
        the job ends. The fault's actions run on timers, so a site that answers slowly does not delay them."""
        reader = threading.Thread(target=self.read_logs, name="log-reader", daemon=True)
        reader.start()
        start = self.now()
        deadline, published, learner_gone, step = start + self.args.run_timeout, None, None, -1
        with self.owner() as api:
            while self.now() < deadline:
                sample = self.sample(api)
                if sample is not None and sample.step > step:  # progress: a loaded machine is slow, not stuck
                    step, deadline = sample.step, min(max(deadline, self.now() + self.args.run_timeout / 2),
                                                      start + PROGRESS_CAP * self.args.run_timeout)
                fresh = bool(self.live) and self.live["summary"]["published_version"] != published
                published = self.live["summary"]["published_version"] if self.live else None
                if self.injected_at is None and sample is not None and sample.status == "running":
                    self.inject(sample, fresh)
                pending = self.player is not None and self.player.is_alive()
                if sample is not None and sample.status in FINAL:
                    return
                exited = self.procs["learner"].poll() is not None and not pending
                learner_gone = (learner_gone or self.now()) if exited else None
                if learner_gone is not None and self.now() - learner_gone > 30:
                    self.notes.append(f"the learner exited (code {self.procs['learner'].returncode}), the job "
                                      f"stayed {sample.status if sample else 'unknown'}")
                    return
                time.sleep(TICK)
        self.notes.append(f"the job did not end: no step for {self.args.run_timeout / 2:g} s, or past "
                          f"{PROGRESS_CAP} x --run-timeout {self.args.run_timeout:g} s")

    def play(self, plan: list[tuple[float, str, Callable[[], None]]]) -> None:
        """The fault's actions in order, each ``delay`` seconds after the injection; stops when the run ends."""
        self.left = [label for _, label, _ in plan]
        self.injected_at = self.now()  # the fault's moment is its first action's, not the decision's before it
        for delay, label, action in plan:
            if self.ended.wait(max(0.0, self.injected_at + delay - self.now())):
                return
            try:
                action()
                self.events.append((self.now(), label))
                self.left.remove(label)
            except Exception as err:  # noqa: BLE001 - a thread of ours: the row reports it, no traceback
                self.notes.append(f"{label} failed: {type(err).__name__}: {err}")
                return

    def inject(self, sample: fa.Sample, fresh: bool) -> None:
        """Start the fault's actions (its ``plan``: delay, label, action) in a thread of their own once its moment
        came."""
        if not self.fault.target or sample.step < fault_step(self.args.steps):
            return
        victim = self.pick_victim(fresh)
        if victim is None:
            return
        self.victim, name = victim, victim[0]
        self.injected_at = self.now()
        self.player = threading.Thread(target=self.play, args=(self.fault.plan(self, name),), daemon=True)
        self.player.start()

    def pick_victim(self, fresh: bool) -> tuple[str, int | None] | None:
        """The process to fault: a chain parent (right after a publication) for relay faults, an active worker
        that relays to nobody for worker faults, else the component itself."""
        target = self.fault.target
        if target not in ("relay", "worker"):
            return (target, None) if target != "learner" or self.tail.steps else None
        chains = self.live["broadcast"]["chains"]
        parents = [n["id"] for chain in chains for n in chain[:-1]]
        if target == "relay":
            if not fresh or not parents:
                return None
            worker = parents[len(parents) // 2]  # the middle of a chain of three
        else:
            tails = [w for w in (w["id"] for w in self.live["workers"]) if w not in parents]
            if not tails:
                return None
            worker = tails[-1]
        name = next((n for n, (_, _, wid) in self.setup.agents.items() if wid == worker), None)
        return (f"agent-{name}", worker) if name else None

    def came_back(self, action: Callable, *args) -> None:
        action(*args)
        self.back_at = self.now()

    def cont_once_released(self, name: str) -> None:
        """SIGCONT a frozen worker 2 s after the site released it (the job page's active set), or after the
        longest the site may take (worker timeout + one expiry beat + 5 s)."""
        deadline = self.injected_at + WORKER_TIMEOUT_S + BEAT_S + 5
        while self.now() < deadline and self.victim[1] in (self.samples[-1].active if self.samples else ()):
            time.sleep(TICK)
        time.sleep(2)
        self.signal(name, signal.SIGCONT)

    def restart_agent(self, name: str) -> None:
        self.victim_tail = fa.AgentLogTail(self.stack.logs / f"{name}.log", from_end=True)
        self.restart(name)

    def restart_redis(self) -> None:
        self.restart("redis")
        wait_for(lambda: redis_up(self.redis_port), "Redis to restart", 30)

    def restart_site(self) -> None:
        self.restart("daphne")
        wait_for(lambda: site_up(self.setup.server), "the site to restart", 90)

    def stop(self) -> None:
        self.ended.set()
        if self.player is not None:
            self.player.join(120)
        for name in list(self.frozen):
            self.signal(name, signal.SIGCONT)
        self.stack.stop()

    def allowed_s(self) -> float | None:
        """Issue 13's bound on recovery: one training step (the mean step period before the fault) plus what
        detects the fault (its ``detection_s``, bench/faults/)."""
        t = self.injected_at
        period = fa.step_period(self.tail.steps, t) if t is not None else None
        if t is None or period is None:
            return None
        restart = fa.first_after(self.tail.ready, t)
        return period + self.fault.detection_s(down=(self.back_at or t) - t,
                                               restart=None if restart is None else restart - t)

    def allowed_pool_s(self) -> float | None:
        """The bound on the pool's recovery where it differs from :meth:`allowed_s`: after a fault whose pool waits
        for the restart (``worker-kill``) the pool is short of the killed worker until it runs again, so one step
        after the restarted agent said it installed a snapshot (kill -> ready counts as the learner's restart does
        in ``learner-kill``)."""
        if not self.fault.pool_waits_for_restart:
            return self.allowed_s()
        t = self.injected_at
        period = fa.step_period(self.tail.steps, t) if t is not None else None
        if t is None or period is None or self.victim_tail is None or not self.victim_tail.ready:
            return None
        return period + self.victim_tail.ready[0] - t

    def billed_discarded(self, row: dict) -> tuple[float | None, str]:
        """Worker-seconds billed for work that was thrown away (estimate; docs/faults.md)."""
        billed = (self.samples[-1].cost_usd if self.samples else 0.0) * 3600 / PRICE
        if not billed or not row["accepted"]:
            return None, "nothing billed or accepted"
        lost = max(row["lost"] or 0, 0)
        wasted = max(row["dropped_stale"] + lost + row["trained_twice"], 0) * billed / row["accepted"]
        idle, start = 0.0, self.injected_at
        if start is not None and self.fault.target in ("relay", "worker"):
            idle = fa.billed_while(self.samples, self.victim[1], start, self.back_at or self.now())
        elif start is not None and self.fault.target in ("redis", "daphne"):
            before = [s for s in self.samples if s.t <= start]
            idle = ((self.back_at or start) - start) * (len(before[-1].active) if before else 0)
        return wasted + idle, f"{wasted:.0f} discarded records + {idle:.0f} billed while unable to deliver"

    def bills(self, row: dict, commands: list[list[bytes]] | None) -> dict | None:
        """Billed generating worker-seconds (the ledger) against lease-held ones (the prompt stream's deliveries and
        acknowledgements in Redis' append-only file, clipped to the open sockets), fault_bills.reconcile; the stalled
        span is from the fault to the next step where the job could not progress meanwhile (learner, Redis or site
        away)."""
        from dataplane.replay import PROMPT_GROUP, prompts_key

        if commands is None:  # no append-only file
            return None
        until, t = time.time(), self.injected_at
        stalled = []
        if t is not None and self.fault.target in ("learner", "redis", "daphne"):
            end = t + row["step_s"] if row["step_s"] is not None else self.now()
            stalled = [(self.wall0 + t, self.wall0 + end)]
        billed, sessions = fb.site_records(self.dir / "site.sqlite3", self.job_id, until)
        leases = fb.aof_leases(commands, key=prompts_key(self.job_id), group=PROMPT_GROUP,
                               timeout_s=LEASE_TIMEOUT_S)
        held = {int(name.removeprefix("worker-")): spans for name, spans in leases.items()}
        out = fb.reconcile(billed=billed, held=held, sessions=sessions, stalled=stalled, until=until)
        (self.dir / "bills.json").write_text(json.dumps({"billed": billed, "held": held, "sessions": sessions,
                                                         "stalled": stalled, "wall0": self.wall0}))
        return out

    def report(self, started: float) -> dict:
        """The row: the job's end, recovery, and the audit of every record."""
        with self.owner() as api:
            metrics = api.get(f"jobs/{self.job_id}/metrics/").raise_for_status().json()
            summary = api.get(f"jobs/{self.job_id}/summary/").raise_for_status().json()
        from dataplane.replay import trajectories_key

        aof = self.dir / "redis" / "appendonlydir"
        commands = list(fa.aof_commands(aof)) if aof.exists() else None  # read once: the stream and the leases
        stream = fa.stream_audit(commands, trajectories_key(self.job_id)) if commands is not None else None
        row = {"fault": self.fault.name, "status": summary["status"], "status_reason": summary["status_reason"],
               "completed": summary["status"] == "completed", **fa.audit(metrics, summary, stream, GROUP)}
        t = self.injected_at
        row["injected_at"] = t
        row["step_s"] = fa.step_recovery(self.tail, t, restarted=self.fault.target == "learner") \
            if t is not None else None
        row["pool_s"], row["pool_level"] = fa.throughput_back(self.samples, t) if t is not None else (None, None)
        row["allowed_s"], row["allowed_pool_s"] = self.allowed_s(), self.allowed_pool_s()
        if summary["status"] not in FINAL:  # records in flight when the bench gave up are not lost: unknown
            row["notes"].append(f"the job had not ended: {row['lost'] // GROUP} groups accepted but not yet trained "
                                "nor dropped (in flight, not counted lost)")
            row["lost"] = None
        row["billed_discarded_ws"], row["billed_note"] = self.billed_discarded(row)
        row["bills"] = self.bills(row, commands)
        row["events"] = [f"{at:.1f}s {label}" for at, label in self.events]
        row["notes"] += self.notes
        if self.left:
            row["notes"].append(f"the job ended before the fault's last action ({', '.join(self.left)})")
        row["seconds"] = time.monotonic() - started
        row["logs"] = str(self.stack.logs)
        return row


def run_one(setup: Setup, fault: Fault, console) -> dict:
    started = time.monotonic()
    run = Run(setup, fault)
    try:
        run.launch()
        run.watch()
        return run.report(started)
    finally:
        run.stop()
        console.print(f"  {fault.name}: {time.monotonic() - started:.0f} s; events: "
                      + (", ".join(f"{at:.1f}s {label}" for at, label in run.events) or "none"))

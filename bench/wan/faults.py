"""Faults on a running WAN job and what recovery took, driven beside :meth:`WanStack.wait`:

1. **Partition**: once the learner passed ``after_step``, one agent's link goes down for ``partition_s`` (40 s:
   nothing crosses it either way; bench/wan/netns.py ``set_link``), then comes back. Recovery: its websocket open
   again (the site proxy's tap), and its first group returned under a current version (the newest published when
   the link came back, or later), read from Redis' append-only file (while the run goes on, and after it).
2. **A relay down mid-broadcast**: at the next publication whose chain plan has a relay with a child, that relay's
   agent is killed ``kill_after_s`` after the publication was seen (its chunks flowing to the child). Recovery: the
   site's repair (the dead relay out of the plan: its child moved), and the child's install of that version (or a
   newer one) by another path, from the child's log.

Every wait has a timeout; a fault that could not be set up or did not recover says so in its record.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from . import report
from .stack import WanStack

INSTALL = re.compile(r"installed snapshot v(\d+) of job \d+ \(([\d.]+) ?s (after publication|after joining)")


@dataclass
class FaultPlan:
    after_step: int  # the partition starts once the learner reported this step (the clean part of the run before)
    partition_s: float = 40.0
    kill_after_s: float = 1.5  # a relay is killed this long after its publication was seen
    recover_timeout_s: float = 90.0  # each wait for a recovery
    relay_wait_s: float = 30.0  # for a publication planned along a chain of two or more (else no relay to kill)


class Faults(threading.Thread):
    """The fault script, in a thread of its own while the main thread watches the job. ``events`` is what
    happened (wall-clock times, ids, nodes); ``error`` why the script stopped early."""

    def __init__(self, stack: WanStack, plan: FaultPlan) -> None:
        super().__init__(name="wan-faults", daemon=True)
        self.stack, self.plan = stack, plan
        self.events: dict = {}
        self.error: str | None = None
        self.stopping = threading.Event()
        self.down: str | None = None

    def stop(self) -> None:
        self.stopping.set()
        self.join(self.plan.partition_s + 30)
        if self.down:  # never leave a link down behind us
            self.stack.link(self.down, True)

    def run(self) -> None:
        """The relay fault first (the site plans chains of two or more early; once it has measured the relays it
        may plan every worker a seed of its own), then the partition; each fault's failure is its own record."""
        try:
            self.until(lambda: self.live()["summary"]["step"] >= self.plan.after_step, f"step {self.plan.after_step}",
                       self.plan.recover_timeout_s * 3)
            for fault in (self.relay_down, self.partition):
                try:
                    fault()
                except (TimeoutError, RuntimeError, OSError, KeyError, StopIteration) as err:
                    if self.stopping.is_set():
                        raise
                    self.events.setdefault(fault.__name__, {})["error"] = f"{type(err).__name__}: {err}"
        except Exception as err:  # noqa: BLE001 - reported in the bench's row, the run goes on
            self.error = f"{type(err).__name__}: {err}"
        finally:
            if self.down:
                self.stack.link(self.down, True)
                self.down = None

    @property
    def first_fault(self) -> float:
        """When the first fault began (wall; inf: none did): the clean part of the run ends there."""
        times = [self.events.get("relay_down", {}).get("t_kill"), self.events.get("partition", {}).get("t_down")]
        return min((t for t in times if t is not None), default=float("inf"))

    # ---- helpers -----------------------------------------------------------------------------------------

    def sleep(self, seconds: float) -> None:
        if self.stopping.wait(seconds):
            raise TimeoutError("the run ended first")

    def until(self, check, what: str, timeout: float, every: float = 0.3):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = check()
            if found:
                return found
            self.sleep(every)
        raise TimeoutError(f"{what}: not within {timeout:g} s")

    def live(self) -> dict:
        with self.stack.api() as api:
            return api.get(f"jobs/{self.stack.job_id}/live/").raise_for_status().json()

    def node_of(self, worker_id: int) -> str:
        return next(n for n, w in self.stack.workers.items() if w == worker_id)

    def agent_state(self, node: str) -> dict | None:
        wid = self.stack.workers[node]
        return next((w for w in self.live()["workers"] if w["id"] == wid), None)

    # ---- the faults --------------------------------------------------------------------------------------

    def partition(self) -> None:
        plan = self.plan
        live = self.live()
        parents = {c[i]["id"] for c in live["broadcast"]["chains"] for i in range(len(c) - 1)}
        agents = [n for n in self.stack.workers if f"agent-{n}" not in self.stack.killed]
        slow = list(self.stack.workers)[-1]  # the profile's last link may be the slow one (harsh)
        spare = [n for n in agents if n != slow] or agents
        node = next((n for n in reversed(spare) if self.stack.workers[n] not in parents), spare[-1])
        ev = self.events.setdefault("partition", {})
        ev.update(node=node, worker=self.stack.workers[node], seconds=plan.partition_s)
        ev["t_down"], self.down = time.time(), node
        self.stack.link(node, False)
        self.sleep(plan.partition_s)
        self.stack.link(node, True)
        self.down = None
        ev["t_up"] = time.time()
        ev["version_at_up"] = self.live()["summary"]["published_version"]

        aof = self.stack.workdir / "redis" / "appendonlydir"

        def generating_current():
            # A group the site accepted from it under a current version, read from Redis' append-only file (what
            # the report's ``generating_s`` reads after the run). Not the live state: that is "generating" only while
            # a lease is out, a quarter of the time on the tiny job (the rest it waits for the learner's prompts),
            # so a recovered agent could read "idle" at every look for a minute.
            state = self.agent_state(node)
            ev["last_seen"] = ({k: state[k] for k in ("status", "state", "state_reason", "installed_version")}
                               if state else "not among the job's active workers")
            return aof.exists() and report.first_group(aof, self.stack.job_id, ev["worker"], after=ev["t_up"],
                                                       min_version=ev["version_at_up"])

        try:
            self.until(generating_current, f"{node} generating under v{ev['version_at_up']}+", plan.recover_timeout_s,
                       every=2.0)
            ev["t_seen_generating"] = time.time()
        except TimeoutError as err:
            ev["not_recovered"] = str(err)

    def relay_down(self) -> None:
        plan = self.plan
        seen = self.live()["summary"]["published_version"]

        def next_relayed():
            live = self.live()
            b = live["broadcast"]
            if b["version"] <= seen:
                return None
            chains = [c for c in b["chains"] if len(c) >= 2 and f"agent-{self.node_of(c[0]['id'])}"
                      not in self.stack.killed]
            return (b["version"], chains[0]) if chains else None

        version, chain = self.until(next_relayed, "a publication the site planned along a chain of two or more",
                                    plan.relay_wait_s)
        seen_at = time.time()
        relay, child = self.node_of(chain[0]["id"]), self.node_of(chain[1]["id"])
        ev = self.events.setdefault("relay_down", {})
        ev.update(node=relay, worker=chain[0]["id"], child=child, child_worker=chain[1]["id"], version=version)
        with self.stack.api() as api:
            snaps = api.get(f"jobs/{self.stack.job_id}/snapshots/").raise_for_status().json()
        published = next(s["published_at"] for s in snaps if s["version"] == version)
        ev["t_published"] = datetime.fromisoformat(published.replace("Z", "+00:00")).timestamp()
        self.sleep(max(0.0, plan.kill_after_s - (time.time() - seen_at)))
        ev["t_kill"] = time.time()
        self.stack.kill_agent(relay)

        def repaired():
            b = self.live()["broadcast"]
            if b["version"] != version or any(n["id"] == ev["worker"] for c in b["chains"] for n in c):
                return None if b["version"] == version else b
            return b

        try:
            b = self.until(repaired, f"v{version}'s plan without {relay}", plan.recover_timeout_s)
            ev["t_repaired"], ev["repaired_plan_version"] = time.time(), b["version"]  # newer: the plan moved on
            route = next(([n["id"] for n in c] for c in b["chains"] if any(n["id"] == ev["child_worker"] for n in c)),
                         None)
            at = route.index(ev["child_worker"]) if route else -1
            ev["child_parent"] = "http" if not route else "learner" if at == 0 else self.node_of(route[at - 1])
        except TimeoutError as err:
            ev["not_repaired"] = str(err)
        log = self.stack.stack.logs / f"agent-{child}.log"
        try:
            ev["child_install"] = self.until(lambda: child_install(log, version),
                                             f"{child} installing v{version}+", plan.recover_timeout_s, every=0.5)
        except TimeoutError as err:
            ev["not_recovered"] = str(err)


def child_install(log: Path, version: int) -> dict | None:
    """The first install of ``version`` or newer in an agent's log: the version and the agent's seconds after its
    publication."""
    if not log.exists():
        return None
    for match in INSTALL.finditer(log.read_text(errors="replace")):
        if int(match.group(1)) >= version:
            return {"version": int(match.group(1)), "seconds": float(match.group(2))}
    return None

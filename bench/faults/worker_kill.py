"""``worker-kill``: a worker holding leases dies and is started again 3 s later; its leases time out."""

from __future__ import annotations

import signal

from .base import LEASE_TIMEOUT_S, Action, Fault, register_fault

RESTART_AFTER_S = 3


@register_fault
class WorkerKill(Fault):
    name = "worker-kill"
    about = f"SIGKILL of a worker holding leases, restarted after {RESTART_AFTER_S} s"
    target = "worker"
    detect = f"lease timeout {LEASE_TIMEOUT_S:g} s"
    detect_pool = "its restart (kill -> a snapshot installed)"
    pool_waits_for_restart = True
    does = (f"SIGKILL of an active worker that relays to nobody (it holds leases), `echo2-agent run` again "
            f"{RESTART_AFTER_S} s later")
    detected_by = (f"next step: the lease timeout, {LEASE_TIMEOUT_S:g} s; pool throughput: the agent's restart (kill "
                   "to the site seeing it `generating` again)")

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, f"SIGKILL {victim}", lambda: run.signal(victim, signal.SIGKILL)),
                (RESTART_AFTER_S, f"restart {victim}", lambda: run.came_back(run.restart_agent, victim))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return LEASE_TIMEOUT_S

"""The fault suite's faults (bench/bench_faults.py) and the site and relay timeouts that bound recovery."""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.broadcast.relay import RelayTimeouts

WORKER_TIMEOUT_S, LEASE_TIMEOUT_S, BEAT_S = 10.0, 10.0, 10.0  # site settings of every run; BEAT_S: expiry period

RELAY_STALL_S = RelayTimeouts().stall  # a silent parent is given up after it (idle keepalives keep live ones)
REDIS_BACKOFF_S, RECONNECT_CAP_S = 5.0, 30.0  # replay.py retry backoff cap; the agent's reconnect delay cap


@dataclass(frozen=True)
class Fault:
    name: str
    about: str
    target: str  # "relay", "worker", "learner", "redis", "daphne" or "" (the baseline)
    detect: str  # what detects the fault and bounds recovery (with one training step)
    detect_pool: str = ""  # what bounds the pool's recovery where that differs from ``detect``
    extra_steps: int = 0  # steps the job runs beyond --steps: long outages leave room to measure the recovery


FAULTS = {f.name: f for f in [
    Fault("none", "fault-free baseline", "", ""),
    Fault("relay-kill", "SIGKILL of a chain relay right after a publication", "relay",
          f"relay stall {RELAY_STALL_S:g} s"),
    Fault("worker-kill", "SIGKILL of a worker holding leases, restarted after 3 s", "worker",
          f"lease timeout {LEASE_TIMEOUT_S:g} s", "its restart (kill -> a snapshot installed)"),
    Fault("learner-kill", "SIGKILL of the learner, restarted with the same command", "learner",
          "its restart (kill -> resumed)"),
    Fault("redis-restart", "SIGKILL of Redis, restarted on the same port 1 s later (AOF)", "redis",
          f"the outage + backoff {REDIS_BACKOFF_S:g} s"),
    Fault("site-restart", "SIGKILL of daphne, started again at once", "daphne", "the outage + agent reconnect"),
    Fault("site-outage", "daphne stopped for --outage seconds", "daphne", "the outage + agent reconnect",
          extra_steps=750),  # about a minute more here: the agents may come back up to half the outage late
    Fault("worker-stop", "SIGSTOP of a worker until the site released it, then SIGCONT", "worker",
          f"worker timeout {WORKER_TIMEOUT_S:g} s + expiry beat {BEAT_S:g} s"),
    Fault("relay-stop", "SIGSTOP of a chain relay right after a publication, SIGCONT 20 s later", "relay",
          f"relay stall {RELAY_STALL_S:g} s"),
]}
DEFAULT_FAULTS = list(FAULTS)


def detection_s(fault: str, *, down: float, restart: float | None) -> float:
    """What detects ``fault`` and bounds its recovery (the allowance adds one training step): a timeout, or for an
    outage how long the component was away (``down``) plus the reconnect it then waits for; for ``learner-kill``
    the learner's ``restart`` (kill -> set up again; 0 when it was never seen)."""
    reconnect = down + min(down, RECONNECT_CAP_S)
    return {"relay-kill": RELAY_STALL_S, "relay-stop": RELAY_STALL_S, "worker-kill": LEASE_TIMEOUT_S,
            "worker-stop": WORKER_TIMEOUT_S + BEAT_S, "redis-restart": down + REDIS_BACKOFF_S,
            "site-restart": reconnect, "site-outage": reconnect, "learner-kill": restart or 0.0}[fault]

"""One fault of the suite (bench/bench_faults.py) as one object: its injection, the bound on its recovery, and how
docs/faults.md describes both; the site and relay timeouts those bounds are made of."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from dataplane.broadcast.relay import RelayTimeouts
from dataplane.registry import Registry

WORKER_TIMEOUT_S, LEASE_TIMEOUT_S, BEAT_S = 10.0, 10.0, 10.0  # site settings of every run; BEAT_S: expiry period

RELAY_STALL_S = RelayTimeouts().stall  # a silent parent is given up after it (idle keepalives keep live ones)
REDIS_BACKOFF_S, RECONNECT_CAP_S = 5.0, 30.0  # replay.py retry backoff cap; the agent's reconnect delay cap

Action = tuple[float, str, Callable[[], None]]  # (seconds after the injection, label, what to do)


class Fault:
    """A fault the suite injects into a live job. Subclasses set the texts and override :meth:`plan` and
    :meth:`detection_s`; :func:`register_fault` adds one instance to the suite (bench/faults/__init__.py)."""

    name = ""
    about = ""  # one line, printed when its run starts
    target = ""  # "relay", "worker", "learner", "redis", "daphne" or "" (the baseline): the process to fault
    detect = ""  # what detects the fault and bounds recovery (with one training step), in the verdict lines
    detect_pool = ""  # what bounds the pool's recovery where that differs from ``detect``
    pool_waits_for_restart = False  # the pool is short of the victim until its restart installed a snapshot
    extra_steps = 0  # steps the job runs beyond --steps: long outages leave room to measure the recovery
    does = ""  # docs/faults.md: what the bench does
    detected_by = ""  # docs/faults.md: what detects it

    def plan(self, run: Any, victim: str) -> list[Action]:
        """The injection: actions on ``run`` (bench_faults.Run: ``signal``, ``restart``, ``came_back``, ...)
        against the process named ``victim``, each at its delay after the first."""
        return []

    def detection_s(self, *, down: float, restart: float | None) -> float:
        """The seconds that detect the fault and bound its recovery (the allowance adds one training step):
        ``down`` is how long the faulted component was away, ``restart`` the learner's kill -> set up again."""
        return 0.0

    def doc_row(self) -> str:
        """This fault's row of docs/faults.md's table."""
        return f"| `{self.name}` | {self.does} | {self.detected_by or '—'} |"


REGISTERED: Registry[Fault] = Registry("fault")


def register_fault(cls: type[Fault]) -> type[Fault]:
    """Class decorator: add one instance of ``cls`` to the suite under ``cls.name``."""
    REGISTERED.add(cls.name, cls())
    return cls


def reconnect_s(down: float) -> float:
    """The site was away ``down`` seconds: the agents come back within half the time away so far, capped."""
    return down + min(down, RECONNECT_CAP_S)

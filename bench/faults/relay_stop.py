"""``relay-stop``: a chain parent freezes mid-broadcast (SIGSTOP) and comes back 20 s later."""

from __future__ import annotations

import signal

from .base import RELAY_STALL_S, Action, Fault, register_fault

FROZEN_S = 20


@register_fault
class RelayStop(Fault):
    name = "relay-stop"
    about = f"SIGSTOP of a chain relay right after a publication, SIGCONT {FROZEN_S} s later"
    target = "relay"
    detect = f"relay stall {RELAY_STALL_S:g} s"
    does = f"SIGSTOP of a chain parent right after a publication, SIGCONT {FROZEN_S} s later"
    detected_by = f"relay stall, {RELAY_STALL_S:g} s"

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, f"SIGSTOP {victim}", lambda: run.signal(victim, signal.SIGSTOP)),
                (FROZEN_S, f"SIGCONT {victim}", lambda: run.came_back(run.signal, victim, signal.SIGCONT))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return RELAY_STALL_S

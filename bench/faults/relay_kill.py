"""``relay-kill``: a chain parent dies mid-broadcast; its child gives it up after the relay stall."""

from __future__ import annotations

import signal

from .base import RELAY_STALL_S, Action, Fault, register_fault


@register_fault
class RelayKill(Fault):
    name = "relay-kill"
    about = "SIGKILL of a chain relay right after a publication"
    target = "relay"
    detect = f"relay stall {RELAY_STALL_S:g} s"
    does = ("SIGKILL of a chain parent (the middle of the chain on the job page's live view), right after a "
            "publication; not restarted")
    detected_by = f"relay stall, {RELAY_STALL_S:g} s (`RelayTimeouts.stall`)"

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, f"SIGKILL {victim}", lambda: run.signal(victim, signal.SIGKILL))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return RELAY_STALL_S

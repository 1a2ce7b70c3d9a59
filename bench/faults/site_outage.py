"""``site-outage``: daphne stays down for ``--outage`` seconds; the agents reconnect."""

from __future__ import annotations

import signal

from .base import Action, Fault, reconnect_s, register_fault


@register_fault
class SiteOutage(Fault):
    name = "site-outage"
    about = "daphne stopped for --outage seconds"
    target = "daphne"
    detect = "the outage + agent reconnect"
    extra_steps = 750  # about a minute more here: the agents may come back up to half the outage late
    does = "SIGKILL of daphne, started again `--outage` seconds later"
    detected_by = "as `site-restart`"

    def plan(self, run, victim: str) -> list[Action]:
        return [(0, "SIGKILL daphne", lambda: run.signal(victim, signal.SIGKILL)),
                (run.args.outage, "restart daphne", lambda: run.came_back(run.restart_site))]

    def detection_s(self, *, down: float, restart: float | None) -> float:
        return reconnect_s(down)

"""``star-unlimited``: every worker pulls from the learner's HTTP server with no uplink cap (the ablation's
ideal, section 5.5.1)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..chains import ChainPlan, WorkerStats, star_plan
from . import Strategy, register


@register
class StarUnlimited(Strategy):
    name = "star-unlimited"
    capped = False

    def plan(self, workers: Sequence[WorkerStats], *, can_relay: Collection[int], b0_bps: float,
             now: float) -> ChainPlan:
        return star_plan([w.worker_id for w in workers])

    def closed_form(self, n: int, *, size: float, bw: float, b0: float, chunk: float) -> float:
        """``M/Bw``: every worker at its own line rate."""
        return size / bw

"""``star-limited``: every worker pulls from the learner's HTTP server, all of them within one shared ``B0``
(the ablation of section 5.5.1)."""

from __future__ import annotations

from collections.abc import Collection, Sequence

from ..chains import ChainPlan, WorkerStats, star_plan
from . import Strategy, register


@register
class StarLimited(Strategy):
    name = "star-limited"

    def plan(self, workers: Sequence[WorkerStats], *, can_relay: Collection[int], b0_bps: float,
             now: float) -> ChainPlan:
        return star_plan([w.worker_id for w in workers])

    def closed_form(self, n: int, *, size: float, bw: float, b0: float, chunk: float) -> float:
        """``max(M/Bw, N M/B0)``: each at its line rate until the shared uplink is the bottleneck."""
        return max(size / bw, n * size / b0)

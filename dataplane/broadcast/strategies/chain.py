"""``chain`` (the default): the learner feeds ``N_ch`` seeds that forward down chains (paper section 4.2,
appendix C.3; docs/broadcast.md "Chain assignment").

``N_ch = n_chains(B0, Bw_hat)`` with ``Bw_hat`` the median, over every worker placed (relays and tails alike),
of each worker's own ``Bw_hat``: its measured relay bandwidth, or its registered ``Bw`` until it has relayed once.
Not the median of the measured figures alone: only relay parents are ever measured, and the seeds first, which
the score picks for their speed, so that subset overstates the typical link and would plan too few chains.
Workers that can relay are scored and assembled (``assemble_chains``); the others may only end a chain
(``place_tails``, fastest first); whoever is left over, or dropped by the score, fetches over HTTP.
"""

from __future__ import annotations

import statistics
from collections.abc import Collection, Sequence

from ..chains import ChainPlan, WorkerStats, assemble_chains, n_chains, place_tails
from . import Strategy, register


def median_bandwidth(workers: Sequence[WorkerStats]) -> float | None:
    """``Bw_hat`` of a pool: the median of its workers' figures (None when none has one)."""
    figures = [w.bandwidth_bps for w in workers if w.bandwidth_bps]
    return statistics.median(figures) if figures else None


@register
class Chain(Strategy):
    name = "chain"
    relayed = True

    def plan(self, workers: Sequence[WorkerStats], *, can_relay: Collection[int], b0_bps: float,
             now: float) -> ChainPlan:
        if not workers:
            return ChainPlan(chains=())
        bw_hat = median_bandwidth(workers)
        n_ch = n_chains(b0_bps, bw_hat) if bw_hat else 1
        relays = [w for w in workers if w.worker_id in can_relay]
        plan = assemble_chains(relays, n_ch=n_ch, now=now) if relays else ChainPlan(chains=())
        tails = sorted((w for w in workers if w.worker_id not in can_relay),
                       key=lambda w: (-(w.bandwidth_bps or 0.0), w.worker_id))
        return place_tails(plan, [w.worker_id for w in tails], relays=can_relay, n_ch=n_ch)

    def closed_form(self, n: int, *, size: float, bw: float, b0: float, chunk: float) -> float:
        """``M/Bw + (L-1) c/Bw`` with ``L = ceil(n / N_ch)`` and the seeds' share ``B0/N_ch >= Bw``."""
        chains = min(n, n_chains(b0, bw))
        longest = -(-n // chains)
        seed = min(bw, b0 / chains)
        return size / seed + (longest - 1) * min(chunk, size) / bw

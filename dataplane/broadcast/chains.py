"""Forwarding chains for peer-assisted broadcast: worker score, chain assembly, repair (paper section 4.2,
appendix C.3 and D "Recovery mechanism"). Pure: no Django, no I/O; callers pass statistics and the time.

Appendix C.3 gives the score ``Score_i = Decay_i * (0.5 Speed_i + 0.35 Success_i + 0.15 Stability_i)`` and
the defaults (failure threshold 3, success saturation 10, decay window 600 s) but not the terms
themselves. What we chose, each term in [0, 1] so the weights keep the meaning the paper gives them:

- ``Speed_i = B_i / max_j B_j``: measured relay bandwidth relative to the best worker of the pool being
  ranked (0 while unmeasured). The paper says ranking is "dominated by Speed", so it is pool-relative.
- ``Success_i = min(successes_i, 10) / 10``: completed transfers, saturating at the success count 10.
- ``Stability_i = 1 - min(f_i, 3) / 3`` with ``f_i`` the worker's relay failures (stalls, bad chunks, dead
  links); once a whole decay window (600 s) passes without a new failure, ``f_i`` is forgotten (taken as 0).
- ``Decay_i = max(0, 1 - age_i / 600)``: ``age_i`` is the time since the worker's statistics were last
  refreshed (its last heartbeat), so stale statistics fade out linearly over the window.

Beyond the paper, the score is multiplied by the worker's audit pass rate (``Trust_i``: the share of its groups
the learners audited that matched, 1 until audited; docs/trust.md, Audits): a worker caught forging work is
not the one to trust with everybody's weights either.

Progressive deprioritisation (C.3 "seeds first, then toward chain tails, then dropped from the forwarding
role"): one or two failures lower Stability and so cost seed rank; ``f_i >= failure_threshold`` marks a
worker degraded: it is never a seed and is appended after every healthy worker (toward the tails);
``f_i >= drop_threshold`` (ours, 2x the paper's threshold; the paper gives no number) makes it rollout-only:
in no chain, listed in :attr:`ChainPlan.rollout_only`, fetching from the learner's fallback URL.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass

LEARNER = None
"""Parent of a seed in :func:`parents` and repair moves: the learner itself."""


@dataclass(frozen=True)
class ScoreParams:
    speed_weight: float = 0.5
    success_weight: float = 0.35
    stability_weight: float = 0.15
    failure_threshold: int = 3
    """Failures that zero Stability and mark a relay degraded (paper default 3)."""
    success_saturation: int = 10
    """Successful transfers at which Success saturates (paper default 10)."""
    decay_window_s: float = 600.0
    """Seconds over which statistics fade and failures are forgotten (paper default 600)."""
    drop_threshold: int = 6
    """Failures at which a worker leaves the forwarding role (ours; the paper gives no number)."""


@dataclass(frozen=True)
class WorkerStats:
    worker_id: int
    bandwidth_bps: float | None
    """``Bw_hat`` (bytes/s): measured relay bandwidth, or the registered ``Bw`` where the caller falls back to it
    until a transfer measured one (the site and the simulator do); None: unknown (Speed 0)."""
    successes: int = 0
    failures: int = 0
    last_seen: float = 0.0
    """Time (s, the caller's clock) the statistics were last refreshed."""
    last_failure_at: float | None = None
    audit_pass_rate: float = 1.0
    """Share of its audited groups that passed the learners' audits (1 until audited): ``Trust_i``."""


@dataclass(frozen=True)
class ChainPlan:
    chains: tuple[tuple[int, ...], ...]
    """Each chain from seed to tail; chain ``k``'s seed pulls from the learner."""
    rollout_only: tuple[int, ...] = ()
    """Workers kept out of forwarding; they fetch from the learner's fallback URL."""


def n_chains(b0_bps: float, bw_hat_bps: float) -> int:
    """``N_ch = max(1, floor(B0 / Bw_hat))`` (section 4.2, appendix C.3)."""
    if not bw_hat_bps > 0 or b0_bps < 0:
        raise ValueError(f"n_chains needs B0 >= 0 and Bw_hat > 0, got {b0_bps}, {bw_hat_bps}")
    return max(1, math.floor(b0_bps / bw_hat_bps))


def recent_failures(stats: WorkerStats, *, now: float, params: ScoreParams = ScoreParams()) -> int:
    if stats.last_failure_at is None or now - stats.last_failure_at >= params.decay_window_s:
        return 0
    return stats.failures


def score_terms(stats: WorkerStats, *, best_bandwidth_bps: float, now: float,
                params: ScoreParams = ScoreParams()) -> dict[str, float]:
    """The four terms of appendix C.3 for one worker (see the module docstring for their definitions)."""
    speed = (stats.bandwidth_bps or 0.0) / best_bandwidth_bps if best_bandwidth_bps > 0 else 0.0
    success = min(stats.successes, params.success_saturation) / params.success_saturation
    failures = recent_failures(stats, now=now, params=params)
    stability = 1.0 - min(failures, params.failure_threshold) / params.failure_threshold
    decay = max(0.0, 1.0 - max(0.0, now - stats.last_seen) / params.decay_window_s)
    return {"speed": min(1.0, speed), "success": success, "stability": stability, "decay": decay}


def scores(workers: Sequence[WorkerStats], *, now: float, params: ScoreParams = ScoreParams(),
           best_bandwidth_bps: float | None = None) -> dict[int, float]:
    """``Score_i = Trust_i Decay_i (0.5 Speed_i + 0.35 Success_i + 0.15 Stability_i)`` for every worker.

    Speed is relative to the best bandwidth among ``workers`` unless the caller names the best of a larger
    pool (``best_bandwidth_bps``): a page showing a few workers ranks them against the whole fleet.
    """
    if best_bandwidth_bps is None:
        best_bandwidth_bps = max((w.bandwidth_bps or 0.0 for w in workers), default=0.0)
    out = {}
    for w in workers:
        t = score_terms(w, best_bandwidth_bps=best_bandwidth_bps, now=now, params=params)
        out[w.worker_id] = w.audit_pass_rate * t["decay"] * (
            params.speed_weight * t["speed"] + params.success_weight * t["success"]
            + params.stability_weight * t["stability"])
    return out


def assemble_chains(workers: Sequence[WorkerStats], *, n_ch: int, now: float,
                    params: ScoreParams = ScoreParams()) -> ChainPlan:
    """Top-``n_ch`` healthy workers by score are seeds; the rest are appended round-robin in rank order,
    degraded workers after every healthy one (toward the tails); dropped workers are rollout-only.
    Ties rank by worker id, so the same statistics always give the same chains."""
    score = scores(workers, now=now, params=params)
    ranked = sorted(workers, key=lambda w: (-score[w.worker_id], w.worker_id))
    failures = {w.worker_id: recent_failures(w, now=now, params=params) for w in workers}
    healthy = [w.worker_id for w in ranked if failures[w.worker_id] < params.failure_threshold]
    degraded = [w.worker_id for w in ranked
                if params.failure_threshold <= failures[w.worker_id] < params.drop_threshold]
    dropped = tuple(w.worker_id for w in ranked if failures[w.worker_id] >= params.drop_threshold)
    order = healthy + degraded
    k = min(max(1, n_ch), len(order))
    chains: list[list[int]] = [[] for _ in range(k)]
    for position, worker_id in enumerate(order):
        chains[position % k].append(worker_id)
    return ChainPlan(chains=tuple(tuple(c) for c in chains), rollout_only=dropped)


def place_tails(plan: ChainPlan, tails: Sequence[int], *, relays: Collection[int], n_ch: int) -> ChainPlan:
    """Add workers that cannot serve a child (no relay address, so no listening relay) to ``plan``.

    Such a worker may only end a chain, after its relays (docs/broadcast.md "Enabling relaying"). ``tails``
    come best first (the caller orders them by bandwidth); each ends the shortest chain whose tail is still
    one of ``relays`` (ties: the plan's order); when every chain has its tail, it starts a new chain while
    there are fewer than ``n_ch``, else it is rollout-only and fetches over HTTP.

    A chain that takes such a tail is closed (its tail serves nobody), so the open chains are sorted once and
    handed out in that order: O(C log C + T) for C chains and T tails, not a sort per tail.
    """
    built = [list(c) for c in plan.chains]
    rollout_only = list(plan.rollout_only)
    open_chains = iter(sorted((c for c in built if not c or c[-1] in relays), key=len))
    for worker_id in tails:
        open_chain = next(open_chains, None)
        if open_chain is not None:
            open_chain.append(worker_id)
        elif len(built) < n_ch:
            built.append([worker_id])
        else:
            rollout_only.append(worker_id)
    return ChainPlan(chains=tuple(tuple(c) for c in built if c), rollout_only=tuple(rollout_only))


def star_plan(worker_ids: Sequence[int]) -> ChainPlan:
    """Every worker pulls from the learner, over its HTTP server: no chains, everyone rollout-only (the star
    strategies, and a relayed one whose learner announced no relay)."""
    return ChainPlan(chains=(), rollout_only=tuple(worker_ids))


def parents(plan: ChainPlan) -> dict[int, int | None]:
    """Each worker's parent (``LEARNER`` for seeds and rollout-only workers): what the site sends each agent."""
    out: dict[int, int | None] = {w: LEARNER for w in plan.rollout_only}
    for chain in plan.chains:
        for position, worker_id in enumerate(chain):
            out[worker_id] = chain[position - 1] if position else LEARNER
    return out


def children(plan: ChainPlan) -> dict[int, int | None]:
    """Each worker's one child (None for tails and rollout-only workers): whom its relay may serve."""
    out: dict[int, int | None] = {w: None for w in plan.rollout_only}
    for chain in plan.chains:
        for position, worker_id in enumerate(chain):
            out[worker_id] = chain[position + 1] if position + 1 < len(chain) else None
    return out


def routes(plan: ChainPlan) -> dict[int, tuple[int | None, int | None]]:
    """``(parent, child)`` of every worker in one of the plan's chains, in one pass (O(N)): what a publication
    sends each worker (``route`` per worker would scan the chains N times)."""
    out: dict[int, tuple[int | None, int | None]] = {}
    for chain in plan.chains:
        last = len(chain) - 1
        for i, worker_id in enumerate(chain):
            out[worker_id] = (chain[i - 1] if i else LEARNER), (chain[i + 1] if i < last else None)
    return out


def route(plan: ChainPlan, worker_id: int) -> tuple[int | None, int | None] | None:
    """``(parent, child)`` of a worker in one of the plan's chains (parent ``LEARNER`` for a seed, child None for
    a tail): what its relay dials and whom it serves. None when it is rollout-only or not in the plan."""
    for chain in plan.chains:
        if worker_id in chain:
            i = chain.index(worker_id)
            return (chain[i - 1] if i else LEARNER), (chain[i + 1] if i + 1 < len(chain) else None)
    return None


def repair(plan: ChainPlan, dead_worker_id: int) -> tuple[ChainPlan, list[tuple[int, int | None]]]:
    """Excise a dead or stalled relay; its downstream tail re-attaches to the nearest healthy parent, its own
    parent (the learner if it was a seed). Returns the new plan and the ``(child, new_parent)`` moves.
    A worker not in any chain (rollout-only, unknown) is just removed; no moves."""
    moves: list[tuple[int, int | None]] = []
    chains = []
    for chain in plan.chains:
        if dead_worker_id in chain:
            position = chain.index(dead_worker_id)
            if position + 1 < len(chain):
                moves.append((chain[position + 1], chain[position - 1] if position else LEARNER))
            chain = chain[:position] + chain[position + 1 :]
        if chain:
            chains.append(chain)
    rollout_only = tuple(w for w in plan.rollout_only if w != dead_worker_id)
    return ChainPlan(chains=tuple(chains), rollout_only=rollout_only), moves


def detach(plan: ChainPlan, worker_id: int) -> tuple[ChainPlan, list[tuple[int, int | None]]]:
    """Take ``worker_id`` out of its chain and make it rollout-only (it fetches from the learner's HTTP fallback):
    its child re-attaches to its parent (:func:`repair`). What one child's unconfirmed report of its parent's failure
    does: the reporter moves, the parent keeps its place, and nobody is promoted toward the seeds."""
    new_plan, moves = repair(plan, worker_id)
    if any(worker_id in chain for chain in plan.chains):
        new_plan = ChainPlan(chains=new_plan.chains, rollout_only=(*new_plan.rollout_only, worker_id))
    return new_plan, moves


def reroute(plan: ChainPlan, worker_id: int, *, relays: Collection[int], learner_slots: int,
            holding: Collection[int] = ()) -> tuple[ChainPlan, list[tuple[int, int | None]]] | None:
    """One child's word that its relay parent failed (the issue-26 rule: it moves only itself): ``worker_id`` gets
    another parent that holds or is receiving the version, its own child (the rest of its chain) keeping it as
    parent, and the accused keeping its place (now a tail) and its score. None when no relay qualifies (the caller
    :func:`detach` es it to the learner's HTTP fallback), or when ``worker_id`` is no chain's member below a seed.

    Chain repair of paper section 4.2 / appendix D ("the orphan re-attaches to the nearest healthy upstream"),
    within a plan of chains: an agent relay serves one child, so the accused's own parent can take the reporter
    only when it is the learner, whose relay keeps one slot beyond the plan's seeds (``learner_slots``: the
    plan's chains at publication + 1; the learner sizes its fan-out from that). In order:

    - the accused was a seed: the learner, while the plan has fewer than ``learner_slots`` chains (a new chain
      headed by the reporter). If the seed is dead its own slot is free too; if the reporter lied, it gets from
      the learner's relay what the HTTP fallback would have given it from the same learner, and no rank.
    - the tail of another chain that can serve (in ``relays``): idle uplink that slows nobody. Tails that hold the
      version (``holding``: installed it) first, then the shortest chain (the shallowest new depth), then the
      plan's order.
    - the learner's spare slot for the orphan of a relay below the seeds (it shares ``B0`` with the seeds).
    """
    at = next(((k, chain.index(worker_id)) for k, chain in enumerate(plan.chains) if worker_id in chain), None)
    if at is None or at[1] == 0:
        return None
    k, position = at
    head, moving = plan.chains[k][:position], plan.chains[k][position:]
    tails = sorted((j for j, chain in enumerate(plan.chains) if j != k and chain[-1] in relays),
                   key=lambda j: (plan.chains[j][-1] not in holding, len(plan.chains[j]), j))
    learner_free = len(plan.chains) < learner_slots
    order: list[int | None] = [*tails]
    if learner_free:
        order.insert(0 if position == 1 else len(order), LEARNER)
    if not order:
        return None
    target = order[0]
    built = [list(c) for c in plan.chains]
    built[k] = list(head)
    if target is LEARNER:
        built.append(list(moving))
        new_parent = LEARNER
    else:
        built[target].extend(moving)
        new_parent = plan.chains[target][-1]
    return ChainPlan(chains=tuple(tuple(c) for c in built), rollout_only=plan.rollout_only), [(worker_id, new_parent)]


BANDWIDTH_EWMA = 0.3
"""Weight of the newest transfer in a relay's measured bandwidth ``Bw_hat``."""
BANDWIDTH_MIN_SECONDS = 1.0
"""Shorter transfers measure latency more than bandwidth: not taken."""
HOP_LAG_FRACTION = 0.25
HOP_LAG_MIN_S = 1.0
"""A child that installed within ``max(HOP_LAG_FRACTION x its parent's time, HOP_LAG_MIN_S)`` after its parent kept
pace with what the parent itself received: the hop was not the bottleneck (:func:`hop_was_bottleneck`). Cut-through
makes an honest hop lag its parent by a part's time and a round trip (0.6 s of 4.9 s on the `harsh` WAN links)."""


def hop_was_bottleneck(seconds: float, parent_seconds: float | None) -> bool | None:
    """Whether a child that installed ``seconds`` after publication was held back by its parent's uplink rather than
    by what its parent itself received (``parent_seconds``, its own install): it lagged its parent by more than a
    pipelined hop does. None when the parent's install is unknown (not reported, or none): the site cannot tell."""
    if parent_seconds is None:
        return None
    return seconds - parent_seconds > max(HOP_LAG_FRACTION * parent_seconds, HOP_LAG_MIN_S)


CHILD_BOUND_FRACTION = 0.75
"""A child that received at this share of its own link's registered rate or more was held back by its own downlink,
not by its parent (the `harsh` bench's 10 Mbit/s worker got 86% of its link through a 50 Mbit/s parent)."""


def measured_bandwidth(old_bps: float | None, *, total_bytes: int, seconds: float,
                       parent_seconds: float | None = None, registered_bps: float | None = None,
                       child_bps: float | None = None) -> float | None:
    """A relay's ``Bw_hat`` after a child installed ``total_bytes`` through it ``seconds`` after publication, the
    relay itself having installed the version ``parent_seconds`` after it; ``child_bps``: the child's own link (its
    registered ``Bw``).

    The rate ``total_bytes / seconds`` is a lower bound on the relay's uplink: it did send that much in that time.
    It is its uplink only when the hop was the bottleneck (:func:`hop_was_bottleneck`) and the child's own link was
    not (the rate under ``CHILD_BOUND_FRACTION`` of ``child_bps``). In a chain a child receives no faster than its
    parent receives: a seed's child gets at most the seed's share of ``B0`` (``B0 / N_ch``, half a 50 Mbit/s link
    on the `harsh` WAN bench, where folding that in as the seed's ``Bw_hat`` doubled ``N_ch = floor(B0 / Bw_hat)``
    and turned the chains into a star); and a slow child gets no more than its own link (harsh's 10 Mbit/s worker
    made its 50 Mbit/s parent "measure" 8.6 Mbit/s). So:

    - the hop was the bottleneck: the rate is folded in (a moving average, weight ``BANDWIDTH_EWMA`` for the
      newest; the first measurement is taken as is);
    - it was not, or the site cannot tell: the figure only rises, to the rate when the rate is higher (the relay
      proved it can send that fast), never falls: the relay is not blamed for its own parent's slowness.

    A transfer shorter than ``BANDWIDTH_MIN_SECONDS`` measures latency, not bandwidth (a 40 KB snapshot delivered in
    20 ms "measures" 2 MB/s on a 100 MB/s link), and changes nothing. The result never exceeds ``registered_bps``
    (the provider's own figure bounds what it is planned with: a claim can only cost its maker). Otherwise
    ``old_bps`` is returned unchanged (None while never measured).
    """
    if total_bytes <= 0 or seconds < BANDWIDTH_MIN_SECONDS:
        return old_bps
    rate = total_bytes / seconds
    child_bound = bool(child_bps) and rate >= CHILD_BOUND_FRACTION * child_bps
    if hop_was_bottleneck(seconds, parent_seconds) and not child_bound:
        new = rate if old_bps is None else (1 - BANDWIDTH_EWMA) * old_bps + BANDWIDTH_EWMA * rate
    else:
        current = old_bps if old_bps is not None else registered_bps
        if current is not None and rate <= current:
            return old_bps
        new = rate if old_bps is None else (1 - BANDWIDTH_EWMA) * old_bps + BANDWIDTH_EWMA * rate
    return min(new, registered_bps) if registered_bps else new

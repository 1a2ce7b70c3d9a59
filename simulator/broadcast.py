"""When each worker holds a whole snapshot: the dissemination model of section 4.2 and appendix C.3, over the
plans of the project's own chain strategies (``dataplane.broadcast.strategies``, the objects the site plans with).

Chains (store-and-forward in chunks of ``c`` bytes): the hop into position ``j`` of a chain runs at
``r_j`` (the seed's hop at ``min(Bw_seed, B0 / chains)``, the learner's uplink shared fairly between the
seeds; every other hop at ``min(Bw_parent, Bw_child)``). A chunk leaves a stage only after it fully arrived
and each stage forwards one chunk at a time, so the chain is a deterministic flow line whose last chunk
reaches stage ``j`` at ``sum_{i<=j} c/r_i + (M - c) / min_{i<=j} r_i`` — with equal rates the paper's
``M/Bw + (j-1) c/Bw``.

Star: every worker pulls from the learner, the uplink ``B0`` shared max-min fairly among the transfers
still running (a worker never above its own ``Bw``); with equal caps every worker finishes at
``max(M/Bw, N M/B0)``, the paper's star-limited. ``star-unlimited`` has no uplink cap: ``M / Bw_i``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

from dataplane.broadcast import strategies
from dataplane.broadcast.chains import ChainPlan, WorkerStats


def plan_for(strategy: str, bandwidth: Mapping[int, float], *, b0_bps: float, now: float = 0.0,
             stats: Mapping[int, WorkerStats] | None = None) -> ChainPlan:
    """The forwarding plan a publication uses: the plan of the registered strategy called ``strategy``, as the
    site's publication planning makes it (every simulated worker can relay). ``stats`` are the workers' relay
    statistics, their ``bandwidth_bps`` what their installs measured; a worker without any is ranked by its
    registered ``Bw`` with a full success count."""
    plan = strategies.get(strategy).plan
    stats = stats or {}
    ids = sorted(bandwidth)
    workers = [stats.get(w) or WorkerStats(w, bandwidth[w], successes=10, last_seen=now) for w in ids]
    return plan(workers, can_relay=set(ids), b0_bps=b0_bps, now=now)


def uplink(strategy: str, b0_bps: float) -> float | None:
    """The learner's uplink cap under ``strategy``: ``b0_bps``, or None where the strategy has none."""
    return b0_bps if strategies.get(strategy).capped else None


def flow_line_finish(rates: Sequence[float], *, size: float, chunk: float) -> list[float]:
    """Seconds until each stage of a store-and-forward line holds all of ``size`` in chunks of ``chunk``: the
    first chunk crosses every hop, the rest follows at the slowest hop so far (the last chunk may be short)."""
    first = min(chunk, size)
    out, total, slowest = [], 0.0, math.inf
    for r in rates:
        if not r > 0:
            raise ValueError(f"a hop of rate {r!r} B/s never delivers")
        total += first / r
        slowest = min(slowest, r)
        out.append(total + (size - first) / slowest)
    return out


def chain_rates(chain: Sequence[int], bandwidth: Mapping[int, float], seed_rate: float,
                upload: Mapping[int, float] | None = None) -> list[float]:
    """Rate of the hop into each position: the seed's share of the uplink, then ``min(parent's upload, child's
    download)``; ``upload`` defaults to ``bandwidth`` (a worker's cap both ways)."""
    upload = bandwidth if upload is None else upload
    rates = [min(seed_rate, bandwidth[chain[0]])]
    rates += [min(upload[a], bandwidth[b]) for a, b in zip(chain, chain[1:], strict=False)]
    return rates


def star_finish(caps: Mapping[int, float], *, size: float, uplink: float | None) -> dict[int, float]:
    """Max-min fair sharing of ``uplink`` (None: unlimited) among concurrent pulls capped at ``caps``."""
    if uplink is None:
        return {w: size / c for w, c in caps.items()}
    left = dict.fromkeys(caps, float(size))
    now, out = 0.0, {}
    while left:
        rates = water_fill({w: caps[w] for w in left}, uplink)
        dt = min(left[w] / rates[w] for w in left)
        now += dt
        for w in list(left):
            left[w] -= rates[w] * dt
            if left[w] <= size * 1e-12:
                out[w] = now
                del left[w]
    return out


def water_fill(caps: Mapping[int, float], total: float) -> dict[int, float]:
    """Max-min fair rates: each flow gets ``min(cap, equal share of what the smaller flows left)``."""
    out, left, n = {}, float(total), len(caps)
    for w, cap in sorted(caps.items(), key=lambda kv: kv[1]):
        out[w] = min(cap, left / n)
        left -= out[w]
        n -= 1
    return out


def install_times(plan: ChainPlan, bandwidth: Mapping[int, float], *, size: float, chunk: float,
                  b0_bps: float | None, upload: Mapping[int, float] | None = None) -> dict[int, float]:
    """Seconds from publication until each worker of ``plan`` holds the whole snapshot.

    A plan of one-worker chains is a star (every worker pulls from the learner, max-min fair within
    ``b0_bps``; None: no cap). Otherwise the uplink is split evenly between the chain seeds and the
    rollout-only workers, which pull over HTTP at their share. ``upload``: what each relay forwards at, when
    it differs from its download cap ``bandwidth`` (a slowed forwarder)."""
    if all(len(c) == 1 for c in plan.chains):
        caps = {c[0]: bandwidth[c[0]] for c in plan.chains} | {w: bandwidth[w] for w in plan.rollout_only}
        return star_finish(caps, size=size, uplink=b0_bps)
    pullers = len(plan.chains) + len(plan.rollout_only)
    share = math.inf if b0_bps is None else b0_bps / pullers
    out: dict[int, float] = {}
    for chain in plan.chains:
        out.update(zip(chain, flow_line_finish(chain_rates(chain, bandwidth, share, upload), size=size, chunk=chunk),
                       strict=True))
    for w in plan.rollout_only:
        out[w] = size / min(share, bandwidth[w])
    return out


def t_bcast(times: Mapping[int, float] | Sequence[float], *, q: float) -> float:
    """Seconds until a share ``q`` of the workers installed (section 5.1: ``q = 1/gamma``)."""
    values = sorted(times.values() if isinstance(times, Mapping) else times)
    if not values:
        return 0.0
    return values[max(0, math.ceil(q * len(values) - 1e-9) - 1)]


def closed_form(strategy: str, n: int, *, size: float, bw: float, b0: float, chunk: float) -> float:
    """The paper's formulas for ``n`` equal workers (section 5.5.1), each strategy's own
    (``Strategy.closed_form``): what tests and benches compare to."""
    return strategies.get(strategy).closed_form(n, size=size, bw=bw, b0=b0, chunk=chunk)

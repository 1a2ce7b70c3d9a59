"""Snapshot transfers as fluid flows over shared access links: what the relays' TCP streams do on a WAN, where
publications overlap (a learner that publishes every few seconds starts the next broadcast before the last ended).

Every transfer is one flow ``parent -> child`` of one version's ``size`` bytes (``parent`` None: the learner). A flow
crosses two links, the parent's uplink and the child's downlink; the flows sharing a link get max-min fair rates
(progressive filling: what TCP flows through one tbf queue converge to), each within its own cap (a TCP window over
the path's round trip). A relay forwards parts as they arrive (cut-through, dataplane/broadcast/serving.py): a child's
flow never holds more than its parent's flow of the same version less one ``part`` (the relay sends a part once it
holds it), so a child that caught up runs at its parent's rate.

Pure: no SimPy; :class:`FlowNet` is advanced by whoever owns the clock (simulator/wan.py).
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field

EPS = 1e-9  # a flow within this share of its size from a bound (its size, its parent's bytes) has reached it


@dataclass(eq=False)
class Flow:
    version: int
    child: Hashable
    parent: Hashable | None
    """None: the learner."""
    size: float
    start: float
    """When its first byte can move (announced, connected, asked)."""
    cap: float = math.inf
    """Bytes/s it never exceeds on its own (the TCP window over the path's round trip)."""
    upstream: Flow | None = None
    """The parent's own flow of this version while the parent is still receiving it (cut-through)."""
    hold: float | None = None
    """Bytes it trails its parent by (None: the net's ``part``)."""
    done: float = 0.0
    rate: float = 0.0
    finished_at: float | None = None
    links: tuple = field(default=(), repr=False)


class FlowNet:
    """The flows in progress over capacities ``uplink`` (node -> bytes/s; the learner under the key None) and
    ``downlink``; ``part``: the bytes a relay holds before it forwards them."""

    def __init__(self, uplink: Mapping, downlink: Mapping, *, part: float) -> None:
        self.capacity = {("up", k): v for k, v in uplink.items()} | {("down", k): v for k, v in downlink.items()}
        self.part = part
        self.flows: list[Flow] = []
        self.now = 0.0

    def add(self, flow: Flow) -> Flow:
        flow.links = (("up", flow.parent), ("down", flow.child))
        self.flows.append(flow)
        self._rates()
        return flow

    def _available(self, flow: Flow) -> float:
        """Bytes the flow may have delivered by now: all of them, or its parent's less one part."""
        up = flow.upstream
        if up is None or up.finished_at is not None:
            return flow.size
        return max(0.0, up.done - self._hold(flow))

    def _active(self) -> list[Flow]:
        return [f for f in self.flows if f.finished_at is None and f.start <= self.now + 1e-12]

    def _rates(self) -> None:
        """Max-min fair rates over the links, each flow within its cap and, when it has caught up with its parent
        (or its parent holds less than a part), within its parent's rate; iterated because the parent's rate is
        itself an outcome (a chain is a few hops: it settles in as many rounds)."""
        active = self._active()
        for f in self.flows:
            f.rate = 0.0
        caps = {f: f.cap for f in active}
        rates: dict[Flow, float] = {}
        for _ in range(8):
            rates = fair_rates(active, caps, self.capacity)
            bound = {f: self._bound(f, rates) for f in active}
            if all(math.isclose(bound[f], caps[f], rel_tol=1e-9, abs_tol=1e-12) for f in active):
                break
            caps = bound
        for f in active:
            f.rate = rates.get(f, 0.0)

    def _bound(self, f: Flow, rates: Mapping[Flow, float]) -> float:
        """A flow's cap this round: its own, or (caught up with a parent still receiving) its parent's rate, 0 while
        the parent holds less than a part."""
        up = f.upstream
        if up is None or up.finished_at is not None or f.done < self._available(f) - EPS * f.size:
            return f.cap
        return min(f.cap, rates.get(up, 0.0) if up.done >= self._hold(f) - EPS * up.size else 0.0)

    def _hold(self, f: Flow) -> float:
        return self.part if f.hold is None else f.hold

    def next_event(self) -> float:
        """The earliest time something changes: a flow starts or ends, catches up with its parent, or a parent's
        first part is in (its child may start); inf when nothing is left."""
        times = [f.start for f in self.flows if f.finished_at is None and f.start > self.now + 1e-12]
        for f in self._active():
            if f.rate > 0:
                times.append(self.now + (f.size - f.done) / f.rate)
            up = f.upstream
            if up is None or up.finished_at is not None:
                continue
            if up.done < self._hold(f) - EPS * up.size and up.rate > 0:
                times.append(self.now + (self._hold(f) - up.done) / up.rate)
            gap = self._available(f) - f.done
            if gap > EPS * f.size and f.rate > up.rate:
                times.append(self.now + gap / (f.rate - up.rate))
        return min(times, default=math.inf)

    def advance(self, to: float) -> list[Flow]:
        """Move the clock to ``to`` (not past :meth:`next_event`), the bytes with it; the flows that ended."""
        dt = max(0.0, to - self.now)
        moved = {f: min(f.size, f.done + f.rate * dt) for f in self._active()}
        for f in moved:
            up = f.upstream
            if up is not None and up.finished_at is None and up.done + up.rate * dt < up.size * (1 - EPS):
                moved[f] = min(moved[f], max(0.0, moved.get(up, up.done) - self._hold(f)))
        ended = []
        for f, done in moved.items():
            f.done = done
            if f.done >= f.size * (1 - EPS):
                ended.append(f)
        self.now = to
        for f in sorted(ended, key=lambda f: f.upstream is not None):  # parents first
            f.done, f.finished_at = f.size, to
        self.flows = [f for f in self.flows if f.finished_at is None]
        self._rates()
        return ended

    def in_flight(self, child: Hashable) -> list[Flow]:
        return [f for f in self.flows if f.child == child]


def fair_rates(flows: list[Flow], caps: Mapping[Flow, float], capacity: Mapping) -> dict[Flow, float]:
    """Progressive filling: raise every unfrozen flow's rate together; a flow freezes at its cap, and every flow
    of a link freezes when that link is full. A link not in ``capacity`` is unlimited."""
    rates = dict.fromkeys(flows, 0.0)
    left = {k: v for k, v in capacity.items()}
    free = {f for f in flows if caps[f] > 0}
    while free:
        users: dict = {}
        for f in free:
            for link in f.links:
                if link in left:
                    users.setdefault(link, []).append(f)
        level = min([left[link] / len(fs) for link, fs in users.items()] +
                    [caps[f] - rates[f] for f in free])
        level = max(0.0, level)
        for f in free:
            rates[f] += level
        for link, fs in users.items():
            left[link] -= level * len(fs)
        full = {link for link, fs in users.items() if left[link] <= 1e-9 * max(1.0, capacity[link])}
        free = {f for f in free if caps[f] - rates[f] > 1e-9 and not any(link in full for link in f.links)}
    return rates

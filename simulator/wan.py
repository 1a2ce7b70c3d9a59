"""Broadcasts on wide-area links inside the fleet simulator (``NetSpec.wan``): each publication's transfers are flows
over the nodes' access links (simulator/flows.py), sharing them with the transfers of earlier publications still in
flight, with the latencies and rules of the real protocol:

- the learner's publication reaches the site one way later (the site's clock starts T_bcast there); the site plans
  it with the project's own strategy over the workers' relay statistics as the site keeps them: a relay's ``Bw_hat``
  is ``chains.measured_bandwidth`` of the snapshot's bytes over its children's seconds to install, the registered
  rate until measured (marketplace/services/installs.py ``_relay_succeeded``);
- the announcement reaches each agent one way later; a fetch then asks its parent (one path round trip before the
  first byte: the hello there, the data back); a version the agent forwards to no child waits while another version
  is fetched, and a newer one replaces it (worker_agent/session.py ``_offer``);
- the last byte in, the weights go into the engine once no batch is generating (the agent's ``install_lock``; the
  next batch waits for them), ``install_s`` later (with :class:`MeasuredWan`, drawn per install around it, as the
  runs' installs spread); the install is reported to the site one way later, where it
  counts towards ``ceil(active / gamma)`` installs of that version, and an older version finishing after a newer
  one was installed is not installed (worker_agent/installs.py).

A part of :class:`simulator.fleet.FleetSim`, which holds the workers, the clock and the result.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from dataplane.broadcast.chains import WorkerStats, measured_bandwidth

from .broadcast import plan_for
from .flows import Flow, FlowNet
from .model import Link, WanSpec


@dataclass(frozen=True)
class MeasuredWan(WanSpec):
    """A :class:`~simulator.model.WanSpec` whose installs vary as a run's did: each install's seconds after its last
    byte is gamma-distributed with mean ``install_s`` and this coefficient of variation (bench/sim_wan.py measures
    it on the WAN runs' agents' logs against their parents' taps: an install rebuilds the payload, reads the tensors
    and loads them on a loaded machine, so one takes 0.1 s and the next 0.9 s)."""

    install_cv: float = 0.0


def one_way(a: Link, b: Link) -> float:
    """Seconds one way between two nodes: half of each link's round trip."""
    return (a.rtt_s + b.rtt_s) / 2


class WanBroadcast:
    """The publication, fetch and install processes of :class:`~simulator.fleet.FleetSim` under ``NetSpec.wan``."""

    def _wan_setup(self) -> None:
        wan = self.cfg.net.wan
        self.links = dict(wan.workers)
        g = wan.goodput
        self.flownet = FlowNet({None: wan.learner.up_bps * g} | {w: x.up_bps * g for w, x in self.links.items()},
                               {w: x.down_bps * g for w, x in self.links.items()}, part=wan.part_bytes)
        self.flow_of: dict[tuple[int, int], Flow] = {}  # (version, worker) -> its fetch in flight
        self.held: dict[int, tuple[int, int | None]] = {}  # worker -> (version, parent) waiting for a fetch to end
        self.measured: dict[int, float | None] = {}  # worker -> the site's Bw_hat of it as a relay
        self.relay_successes: dict[int, int] = {}
        self.landing: dict[int, list] = {}  # worker -> installs waiting for its batch to end (the install lock)
        self.busy_until = dict.fromkeys(self.spec, 0.0)
        self.counting: dict[int, dict] = {}  # version -> the site's count: need, done, its publication time
        self.install_rng = random.Random(f"{self.cfg.seed}-installs")  # its own: other draws keep their sequences
        self.flow_wake = self.env.event()
        self.env.process(self._network())

    def _wan_publish(self, version: int) -> None:
        self.env.process(self._announce(version))

    def _link(self, w: int | None) -> Link:
        return self.cfg.net.wan.learner if w is None else self.links[w]

    def _announce(self, version: int):
        wan, net = self.cfg.net.wan, self.cfg.net
        yield self.env.timeout(wan.publish_s + one_way(wan.learner, wan.site))
        now = self.env.now
        ids = [w for w in self.active if self._ready(w)]
        registered = {w: self.links[w].up_bps for w in ids}
        stats = {w: WorkerStats(w, self.measured.get(w) or registered[w], successes=self.relay_successes.get(w, 0),
                                last_seen=now) for w in ids} if wan.site_bandwidth else None
        self.plan = plan_for(net.strategy, registered, b0_bps=net.b0_bps, now=now, stats=stats)
        q = net.q or 1 / self.cfg.control.gamma
        self.counting[version] = {"need": math.ceil(q * len(ids) - 1e-9), "done": 0, "at": now, "n": len(ids)}
        delays = {w: one_way(wan.site, self.links[w]) for w in ids}
        first = min(delays.values(), default=0.0)
        yield self.env.timeout(first)
        self._advance()
        for chain in self.plan.chains:
            for k, w in enumerate(chain):
                self._offer(w, version, chain[k - 1] if k else None, has_child=k + 1 < len(chain),
                            delay=delays[w] - first)
        for w in self.plan.rollout_only:
            self._offer(w, version, None, has_child=False, delay=delays[w] - first)
        self._wake()

    def _offer(self, w: int, version: int, parent: int | None, *, has_child: bool, delay: float = 0.0) -> None:
        busy = any(f.child == w and f.version != version for f in self.flownet.flows)
        held = self.held.get(w)
        if self.cfg.net.wan.one_fetch and busy and not has_child:
            if held is None or held[0] < version:
                self.held[w] = (version, parent)
            return
        if held is not None and held[0] <= version:
            del self.held[w]  # superseded
        self._fetch(w, version, parent, delay=delay)

    def _fetch(self, w: int, version: int, parent: int | None, *, delay: float = 0.0) -> None:
        wan = self.cfg.net.wan
        rtt = self._link(parent).rtt_s + self._link(w).rtt_s
        hold = wan.part_bytes + wan.relay_lag_s * self.links[w].down_bps * wan.goodput
        flow = Flow(version, w, parent, self.cfg.learner.snapshot_bytes, start=self.env.now + delay + rtt,
                    cap=wan.window_bytes / rtt if rtt > 0 else math.inf,
                    upstream=self.flow_of.get((version, parent)) if parent is not None else None, hold=hold)
        self.flow_of[(version, w)] = self.flownet.add(flow)

    def _wake(self) -> None:
        if not self.flow_wake.triggered:
            self.flow_wake.succeed()

    def _network(self):
        """Advance the flows to each moment something changes (or a new flow came), and act on the fetches done."""
        while True:
            t = self.flownet.next_event()
            self.flow_wake = self.env.event()
            waits = [self.flow_wake] + ([self.env.timeout(max(0.0, t - self.env.now))] if t < math.inf else [])
            yield self.env.any_of(waits)
            self._advance()

    def _advance(self) -> None:
        for flow in self.flownet.advance(self.env.now):
            self._fetched(flow)

    def _fetched(self, flow: Flow) -> None:
        w, version = flow.child, flow.version
        self.flow_of.pop((version, w), None)
        if self.alive[w] and w in self.active and (self.installed.get(w) or 0) < version:
            self.env.process(self._land(w, version, flow.parent))
        held = self.held.get(w)
        if held is not None and not self.flownet.in_flight(w):
            del self.held[w]
            if (self.installed.get(w) or 0) < held[0]:
                self._fetch(w, *held)
                self._wake()

    def _land(self, w: int, version: int, parent: int | None):
        """Into the engine once the batch generating ends (the next one waits), then reported to the site."""
        gate = self.env.event()
        self.landing.setdefault(w, []).append(gate)
        yield self.env.timeout(max(0.0, self.busy_until[w] - self.env.now) + self._install_seconds())
        landed = self.installed.get(w) is not None and self.installed[w] < version
        if landed:
            self.installed[w] = version
            self._kick(w)
        self.landing[w].remove(gate)
        gate.succeed()
        if not landed:
            return
        count = self.counting.get(version)
        seconds = self.env.now - count["at"] if count else 0.0
        yield self.env.timeout(one_way(self.links[w], self.cfg.net.wan.site) + self.cfg.net.wan.report_s)
        if count is None:
            return
        took = self.env.now - count["at"]
        self.res.installs.setdefault(version, {})[w] = took
        count["done"] += 1
        if count["done"] == count["need"]:
            self.res.t_bcast[version] = took
        if count["done"] == count["n"]:
            self.res.t_all[version] = took
        if parent is not None:
            self.relay_successes[parent] = self.relay_successes.get(parent, 0) + 1
            self.measured[parent] = measured_bandwidth(self.measured.get(parent),
                                                       total_bytes=int(self.cfg.learner.snapshot_bytes),
                                                       seconds=seconds)

    def _install_seconds(self) -> float:
        """One install's seconds after its last byte and the batch generating: ``install_s``, or drawn around it
        (:class:`MeasuredWan`)."""
        wan = self.cfg.net.wan
        cv = getattr(wan, "install_cv", 0.0)  # a plain WanSpec: no spread
        if cv <= 0 or wan.install_s <= 0:
            return wan.install_s
        return self.install_rng.gammavariate(1 / cv**2, wan.install_s * cv**2)

    def _before_batch(self, w: int):
        """The worker's next batch waits for the installs queued on its engine (the agent's install lock)."""
        while self.landing.get(w):
            yield self.landing[w][0]

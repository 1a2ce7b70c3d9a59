"""Faults and absences in the simulated fleet (paper appendix D, Table 4): a worker dropped or slowed at a stage, and
the coming and going of workers whose availability ``a_i`` is below 1. A part of :class:`simulator.fleet.FleetSim`,
which holds the state these act on (who is alive, its speed and relay factor, the broadcast in flight)."""

from __future__ import annotations

import random

from dataplane.broadcast.chains import routes

from .model import Fault


class Faults:
    """What :class:`~simulator.fleet.FleetSim` does to its workers: its ``fault`` and ``availability`` processes."""

    def fault(self, fault: Fault):
        yield self.env.timeout(fault.at)
        if fault.stage == "broadcast":
            yield self.publish_event
        victim = fault.worker_id if fault.worker_id is not None else self._victim(fault.stage)
        if victim is None:
            self.res.events.append((self.env.now, f"no victim for {fault}"))
            return
        self.res.events.append((self.env.now, f"fault: {fault.stage} {fault.kind} worker {victim}"))
        if fault.kind == "drop":
            self._go_away(victim)
        elif fault.stage == "broadcast":
            self.relay[victim] *= fault.factor
            self._reschedule_downstream(victim)
        else:
            self.speed[victim] *= fault.factor

    def _go_away(self, w: int) -> None:
        """The worker vanishes: the group in hand is lost, its chain tail (if a broadcast is in flight) stalls."""
        self.alive[w], self.died_at[w] = False, self.env.now
        self.absences[w] += 1
        self.epoch[w] += 1
        self.env.process(self._relay_died(w))

    def _come_back(self, w: int) -> None:
        """Back after an absence: still active, it re-fetches the current snapshot; released, it is standby."""
        self.alive[w] = True
        self.died_at.pop(w, None)
        if w in self.active:
            self.installed[w] = None  # billed on since its activation, like the site does
            self.env.process(self._cloud_fetch(w))

    def availability(self, w: int):
        """Absences of a worker with ``a_i < 1``: up for Exp(absence a/(1-a)), away for Exp(absence)."""
        a = self.spec[w].availability
        if a >= 1:
            return
        rng, away = random.Random(f"{self.cfg.seed}-away-{w}"), self.cfg.absence_s
        while True:
            if a > 0:
                yield self.env.timeout(rng.expovariate(1 / (away * a / (1 - a))))
            self._go_away(w)
            if a <= 0:
                return
            yield self.env.timeout(rng.expovariate(1 / away))
            self._come_back(w)

    def _victim(self, stage: str) -> int | None:
        if stage == "broadcast":
            parents_of = routes(self.plan)
            forwarders = sorted(w for w, (_, child) in parents_of.items() if child is not None and self.alive[w])
            return forwarders[0] if forwarders else None
        children_of = {w: child for w, (_, child) in routes(self.plan).items()}
        ready = sorted((children_of.get(w) is not None, w) for w in self.active if self._ready(w))
        return ready[0][1] if ready else None  # a worker that forwards to nobody: the fault stays in rollout

    def _reschedule_downstream(self, slow: int) -> None:
        """A forwarder slowed mid-broadcast: the pending installs behind it follow the slower line."""
        published = self.published_at[self.installs["version"]]
        times = self._times(self.plan, self._bandwidth(self.schedule))
        for w in [slow, *self._downstream(slow)]:
            if w in self.schedule and self.schedule[w] > self.env.now:
                at = max(self.env.now, published + self.cfg.net.latency_s + times[w])
                self.schedule[w] = at
                self.env.process(self._install(w, self.installs["version"], at, self.broadcast_gen))

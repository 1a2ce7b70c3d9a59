"""The discrete-event fleet: a learner, rollout workers, snapshot broadcasts, the scheduler, faults (SimPy).

What runs here is the project's own logic where it exists (the target through marketplace.core.provisioning,
activation through marketplace.core.activation, chains through dataplane.broadcast.chains, the hysteresis
controller and heartbeat windows through marketplace.core.controller); what is modelled is the world around it:

- the learner (section 3.2, learner/loop.py): waits until ``R / n`` admissible groups are buffered (a group
  of version ``v`` is admissible at learner version ``v_t`` when ``v >= v_t - S``; older ones are dropped and
  counted), trains ``T_train`` seconds, publishes a snapshot every ``kappa`` steps;
- the prompt backlog (learner/prompts.py): at most ``backlog`` groups in flight; a group frees its slot when
  it is trained or dropped, or after the lease timeout when its worker died holding it;
- workers: lease a group, generate it under the version they have installed (gamma-distributed time of mean
  ``n / mu_i``), return it; a newly activated worker first fetches the current snapshot from cloud storage;
- broadcast (simulator.broadcast): install times of the publication's plan; a dead forwarder stalls its
  downstream until its child gives it up (``relay_stall_s``) and ``dataplane.broadcast.chains.repair`` re-attaches it;
- faults and absences (simulator.faults);
- the scheduler, every ``tick_s``: heartbeats into ``HeartbeatWindow``s, dead workers released after
  ``worker_timeout_s``, ``HysteresisController.decide`` against ``gamma * mu_min``.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import random

import simpy

from dataplane.broadcast.chains import ChainPlan, WorkerStats, repair
from marketplace.core.activation import Candidate, pool_capacity
from marketplace.core.controller import HeartbeatWindow, HysteresisController

from .activation import provision, reliability_of
from .broadcast import install_times, plan_for, uplink
from .faults import Faults
from .model import SimConfig, SimResult, StepRecord
from .stream import Stream
from .wan import WanBroadcast


class FleetSim(Faults, Stream, WanBroadcast):
    """One simulated job: build with a :class:`SimConfig`, :meth:`run` once (or call :func:`simulate`)."""

    def __init__(self, config: SimConfig) -> None:
        self.cfg, self.env = config, simpy.Environment()
        self.rng = random.Random(config.seed)
        self.spec = {w.worker_id: w for w in config.workers}
        self.res = SimResult()
        lr = config.learner
        self.tokens = simpy.Container(self.env, capacity=lr.backlog, init=lr.backlog)
        self.buffer: collections.deque[tuple[int, int]] = collections.deque()  # (version, records) in the stream
        self.taken: collections.deque[tuple[int, int]] = collections.deque()  # read by the learner, not trained
        self.freed, self.topping = 0, False  # slots the prompt feeder has yet to fill; a top-up under way
        self.data = self.env.event()
        self.version = self.published = 0
        self.published_at = {0: 0.0}
        self.installed: dict[int, int | None] = {}
        self.active: dict[int, float] = {}  # worker -> activated at
        self.alive = dict.fromkeys(self.spec, True)
        self.died_at: dict[int, float] = {}
        self.speed = dict.fromkeys(self.spec, 1.0)
        self.busy_until = dict.fromkeys(self.spec, 0.0)
        self.relay = dict.fromkeys(self.spec, 1.0)
        self.stats: dict[int, WorkerStats] = {}
        self.windows: dict[int, HeartbeatWindow] = {}
        self.wake = {w: self.env.event() for w in self.spec}
        self.epoch = dict.fromkeys(self.spec, 0)
        self.absences = dict.fromkeys(self.spec, 0)  # departures during the run (the reliability record's)
        self.plan, self.broadcast_gen = ChainPlan(chains=()), 0
        self.schedule: dict[int, float] = {}  # worker -> when it installs the broadcast in flight (inf: stalled)
        self.installs = {"version": 0, "need": 0, "done": 0, "n": 0}  # that broadcast's progress
        self.publish_event = self.env.event()
        ids, self.target, self.t_bcast_assumed = provision(config, self.rng)
        self.res.target, self.res.initial_ids = self.target, ids
        self.nominal_all = self._nominal_install(ids)
        for w in ids:
            self._activate(w, fetch=False)
        if config.net.wan is not None:
            self._wan_setup()

    # ---- workers -------------------------------------------------------------------------------------

    def _activate(self, w: int, *, fetch: bool) -> None:
        self.active[w] = self.env.now
        self.windows[w] = HeartbeatWindow(window_s=self.cfg.control.window_s, interval_s=self.cfg.control.tick_s)
        if fetch:
            self.installed[w] = None
            self.env.process(self._cloud_fetch(w))
        else:
            self.installed[w] = 0
            self._kick(w)

    def _cloud_fetch(self, w: int):
        version = self.published
        yield self.env.timeout(self.cfg.learner.snapshot_bytes / self.cfg.net.cloud_bps)
        if self.alive[w] and w in self.active:
            self.installed[w] = max(self.installed[w] or 0, version)
            self._kick(w)

    def _kick(self, w: int) -> None:
        if not self.wake[w].triggered:
            self.wake[w].succeed()

    def _release(self, w: int) -> None:
        start = self.active.pop(w, None)
        if start is not None:
            end = self.died_at.get(w, self.env.now)
            self.res.worker_cost += self.spec[w].price_per_hour * max(0.0, end - start) / 3600
        self.windows.pop(w, None)

    def _ready(self, w: int) -> bool:
        return self.alive[w] and w in self.active and self.installed.get(w) is not None

    def _may_generate(self, w: int) -> bool:
        """Ready, and under ``generation='pause'`` holding the newest publication."""
        return self._ready(w) and (self.cfg.generation != "pause" or self.installed[w] >= self.published)

    def worker(self, w: int):
        """Lease up to ``lease_groups`` groups, generate them under the installed version (one by one, or in one
        batch), return each when done; forever. A group whose worker died meanwhile frees its slot at the
        lease timeout."""
        rng = random.Random(f"{self.cfg.seed}-{w}")
        cfg = self.cfg
        while True:
            if not self._may_generate(w):
                self.wake[w] = self.env.event()
                yield self.wake[w]
                continue
            if cfg.lease_retry_s and self.tokens.level < 1:
                yield self.env.timeout(cfg.lease_latency_s + cfg.lease_retry_s)  # NoWork, try again later
                continue
            yield self.tokens.get(1)
            leased = 1 + min(cfg.lease_groups - 1, int(self.tokens.level))
            if leased > 1:
                yield self.tokens.get(leased - 1)
            if cfg.lease_latency_s:
                yield self.env.timeout(cfg.lease_latency_s)
            if cfg.net.wan is not None:
                yield from self._before_batch(w)
            epoch, version = self.epoch[w], self.installed[w]
            if cfg.lease_batch:
                yield from self._generate(w, sum(self._generation_time(w, rng) for _ in range(leased)))
                self._returned(w, epoch, version, leased)
                continue
            for _ in range(leased):
                if cfg.net.wan is not None:
                    yield from self._before_batch(w)
                epoch, version = self.epoch[w], self.installed[w]
                yield from self._generate(w, self._generation_time(w, rng))
                self._returned(w, epoch, version, 1)

    def _generate(self, w: int, seconds: float):
        self.busy_until[w] = self.env.now + seconds  # an install waits for it (simulator/wan.py)
        yield self.env.timeout(seconds)

    def _returned(self, w: int, epoch: int, version: int, groups: int) -> None:
        """Groups done: into the buffer (``return_latency_s`` later), or, if the worker died or was released
        meanwhile, lost until their leases expire."""
        if self.epoch[w] != epoch or not self._ready(w):
            for _ in range(groups):
                self.env.process(self._lease_expires())
            return
        if self.cfg.return_latency_s:
            self.env.process(self._arrive(w, version, groups))
            return
        self._buffered(w, version, groups)

    def _arrive(self, w: int, version: int, groups: int):
        yield self.env.timeout(self.cfg.return_latency_s)
        self._buffered(w, version, groups)

    def _buffered(self, w: int, version: int, groups: int) -> None:
        for _ in range(groups):
            self.buffer.append((version, self.cfg.learner.group))
            self.res.delivered.append((self.env.now, version, self.cfg.learner.group))
        self.res.delivered_by[w] = self.res.delivered_by.get(w, 0) + groups * self.cfg.learner.group
        if not self.data.triggered:
            self.data.succeed()

    def _generation_time(self, w: int, rng: random.Random) -> float:
        """One group: gamma-distributed with mean ``n / mu_i`` (scaled by a slow-down fault) and the run's cv."""
        mean = self.cfg.learner.group / (self.spec[w].throughput * self.speed[w])
        cv = self.cfg.cv
        return rng.gammavariate(1 / cv**2, mean * cv**2) if cv > 0 else mean

    def _lease_expires(self):
        yield self.env.timeout(self.cfg.control.worker_timeout_s)
        yield self.tokens.put(1)

    # ---- learner -------------------------------------------------------------------------------------

    def learner(self):
        lr = self.cfg.learner
        for step in range(1, self.cfg.steps + 1):
            start = self.env.now
            yield from self._gather(lr.groups_per_step)
            batch = [self.taken.popleft() for _ in range(lr.groups_per_step)]
            lags = collections.Counter()
            for version, records in batch:
                lags[self.version - version] += records
            self.res.trained_max_lag = max(self.res.trained_max_lag, max(lags))
            wait = self.env.now - start
            t_train = lr.train_seconds(step)
            yield self.env.timeout(t_train)
            self.res.steps.append(StepRecord(step, start, wait, t_train, dict(lags)))
            self.version += 1
            if self.version % lr.kappa == 0:
                self._publish(self.version)
            overhead = lr.overhead_s + (lr.publish_overhead_s if self.version % lr.kappa == 0 else 0.0)
            if overhead:
                yield self.env.timeout(overhead)
            self._top_up(len(batch))  # the next step's top-up counts these groups as done

    # ---- broadcast -----------------------------------------------------------------------------------

    def _bandwidth(self, ids) -> dict[int, float]:
        """Download caps: a slowed forwarder (``relay``) still receives at its ``Bw``."""
        return {w: self.spec[w].bandwidth_bps for w in ids}

    def _upload(self, ids) -> dict[int, float]:
        return {w: self.spec[w].bandwidth_bps * self.relay[w] for w in ids}

    def _nominal_install(self, ids) -> float:
        """Fault-free seconds until every initial worker holds a publication (the mu_pool trace's grace)."""
        if not ids:
            return 0.0
        times = self._times(plan_for(self.cfg.net.strategy, self._bandwidth(ids), b0_bps=self.cfg.net.b0_bps),
                            self._bandwidth(ids))
        return max(times.values()) + self.cfg.net.latency_s

    def _times(self, plan: ChainPlan, bandwidth: dict[int, float]) -> dict[int, float]:
        net = self.cfg.net
        return install_times(plan, bandwidth, size=self.cfg.learner.snapshot_bytes, chunk=net.chunk_bytes,
                             b0_bps=uplink(net.strategy, net.b0_bps),
                             upload=self._upload(bandwidth))

    def _publish(self, version: int) -> None:
        self.published, self.published_at[version] = version, self.env.now
        if self.cfg.net.wan is not None:  # flows over the links, publications overlapping
            self._wan_publish(version)
            event, self.publish_event = self.publish_event, self.env.event()
            event.succeed(version)
            return
        ids = [w for w in self.active if self._ready(w)]
        bandwidth = self._bandwidth(ids)
        seen = {w: dataclasses.replace(s, last_seen=self.env.now) for w, s in self.stats.items() if w in bandwidth}
        self.plan = plan_for(self.cfg.net.strategy, bandwidth, b0_bps=self.cfg.net.b0_bps, now=self.env.now,
                             stats=seen)  # live workers heartbeat every tick: their statistics are fresh
        self.broadcast_gen += 1
        self.schedule = {w: self.env.now + self.cfg.net.latency_s + t
                         for w, t in self._times(self.plan, bandwidth).items()}
        self.installs = {"version": version, "need": math.ceil((self.cfg.net.q or 1 / self.cfg.control.gamma)
                                                                 * len(ids) - 1e-9), "done": 0, "n": len(ids)}
        for w, at in self.schedule.items():
            self.env.process(self._install(w, version, at, self.broadcast_gen))
        event, self.publish_event = self.publish_event, self.env.event()
        event.succeed(version)

    def _install(self, w: int, version: int, at: float, gen: int):
        yield self.env.timeout(max(0.0, at - self.env.now))
        if gen != self.broadcast_gen or self.schedule.get(w) != at or not self.alive[w]:
            return
        if self.installed.get(w) is not None and self.installed[w] < version:
            self.installed[w] = version
            self._kick(w)
        took = self.env.now - self.published_at[version]
        self.res.installs.setdefault(version, {})[w] = took
        self.stats[w] = WorkerStats(w, self._upload([w])[w],
                                    successes=(self.stats[w].successes + 1) if w in self.stats else 1,
                                    last_seen=self.env.now)
        self.installs["done"] += 1
        if self.installs["done"] == self.installs["need"]:
            self.res.t_bcast[version] = took
        if self.installs["done"] == self.installs["n"]:
            self.res.t_all[version] = took

    def _relay_died(self, dead: int):
        """The dead forwarder's child notices after ``relay_stall_s``; the chain is repaired around it and
        the downstream segment resumes from its parent (chains.repair) with the bytes it already had."""
        gen, died = self.broadcast_gen, self.env.now
        downstream = self._downstream(dead)
        if not downstream or self.schedule.get(downstream[0], 0.0) <= died:
            return  # the child already holds the snapshot: nobody behind the dead relay waits
        old = {w: self.schedule[w] for w in downstream if w in self.schedule}
        for w in old:
            self.schedule[w] = math.inf  # stalled: their pending installs are void
        yield self.env.timeout(self.cfg.net.relay_stall_s)
        if gen != self.broadcast_gen:
            return
        self.plan, _ = repair(self.plan, dead)
        self.res.events.append((self.env.now, f"chain repaired around worker {dead}"))
        rate = min(min(self._bandwidth(downstream).values()), min(self._upload(downstream[:-1]).values(),
                                                                    default=math.inf))
        size, chunk = self.cfg.learner.snapshot_bytes, self.cfg.net.chunk_bytes
        had = min(size, max(0.0, size - (old[downstream[0]] - died) * rate))
        for k, w in enumerate(downstream):
            at = self.env.now + (size - had) / rate + k * chunk / rate
            self.schedule[w] = at
            self.env.process(self._install(w, self.installs["version"], at, gen))

    def _downstream(self, w: int) -> list[int]:
        for chain in self.plan.chains:
            if w in chain:
                return list(chain[chain.index(w) + 1:])
        return []

    # ---- scheduler -----------------------------------------------------------------------------------

    def scheduler(self):
        """Heartbeats, releases of silent workers and the hysteresis controller, every ``tick_s``."""
        control = self.cfg.control
        hysteresis = HysteresisController(control.hysteresis_s, control.release_margin)
        while True:
            now = self.env.now
            for w in list(self.active):
                if not self.alive[w] and now - self.died_at[w] >= control.worker_timeout_s:
                    self._release(w)
                    self.res.events.append((now, f"worker {w} released (silent {control.worker_timeout_s:g} s)"))
                elif w in self.windows:
                    mu = self.spec[w].throughput * self.speed[w] if self._ready(w) else None
                    self.windows[w].add(now, mu, alive=self.alive[w])
            self.res.active_trace.append((now, self.useful_capacity(), len(self.active)))
            if control.controller and self.target < math.inf:
                self._control(hysteresis, now)
            yield self.env.timeout(min(control.tick_s, self.cfg.sample_s))

    def _control(self, hysteresis: HysteresisController, now: float) -> None:
        control = self.cfg.control
        r = {w: reliability_of(s, absence_s=self.cfg.absence_s, absences=self.absences[w], run_s=now)
             if control.reliability else 1.0 for w, s in self.spec.items()}
        window = control.availability_seen == "window"
        active = [Candidate(w, self.spec[w].price_per_hour, self.windows[w].throughput(now) or
                            self.spec[w].throughput, self.windows[w].availability(now), r[w])
                  for w in self.active if w in self.windows]
        standby = [Candidate(w, s.price_per_hour, s.throughput, 1.0 if window else s.availability, r[w])
                   for w, s in self.spec.items() if w not in self.active and self.alive[w] and w not in self.died_at]
        decision = hysteresis.decide(now, pool_capacity(active), self.target, standby, active)
        for w in decision.activate:
            self._activate(w, fetch=True)
            self.res.events.append((now, f"worker {w} activated: {decision.reason}"))
        for w in decision.release:
            self._release(w)
            self.res.events.append((now, f"worker {w} released: {decision.reason}"))

    def useful_capacity(self) -> float:
        """``mu_pool(t)`` of Table 4: throughput of the active, live workers generating under a version no
        older than the newest one they should hold by now (published at least the fault-free install time
        ago). A worker cut off by a dead forwarder falls back to its old policy (appendix D) and counts 0."""
        due = max((v for v, at in self.published_at.items() if at + self.nominal_all <= self.env.now), default=0)
        return sum(self.spec[w].throughput * self.speed[w] for w in self.active
                   if self._ready(w) and self.installed[w] >= due)

    # ---- the run -------------------------------------------------------------------------------------------

    def run(self) -> SimResult:
        for w in self.spec:
            self.env.process(self.worker(w))
            self.env.process(self.availability(w))
        self.env.process(self.scheduler())
        for f in self.cfg.faults:
            self.env.process(self.fault(f))
        learner = self.env.process(self.learner())
        self.env.run(until=learner)
        self.res.end = self.env.now
        for w in list(self.active):
            self._release(w)
        self.res.learner_cost = self.cfg.learner.price_per_hour * self.res.end / 3600
        return self.res


def simulate(config: SimConfig) -> SimResult:
    """Run one configuration to its last learner step; deterministic for a seed."""
    return FleetSim(config).run()

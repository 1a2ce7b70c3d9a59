"""The low-frequency scheduler's pure parts (paper section 4.3, appendix C.2.1): sliding windows over
heartbeats for ``mu_i(t)`` and ``a_i(t)``, and the hysteresis controller that activates and releases
workers only on lasting deviations from the target. No Django, no I/O: callers pass the time.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

from .activation import Candidate, checked_candidates, greedy_by_unit_cost
from .inputs import finite, non_negative, positive, require


class HeartbeatWindow:
    """Sliding-window statistics of one worker's heartbeats (section 4.3): ``mu_i(t)`` and ``a_i(t)``.

    The caller passes every time; the window is ``(now - window_s, now]``. Beats may arrive out of order;
    queries are meant for ``now`` at or after the latest beat (older beats are forgotten as it advances).
    """

    def __init__(self, *, window_s: float, interval_s: float) -> None:
        positive("window_s", window_s)
        positive("interval_s", interval_s)
        require(interval_s <= window_s, "interval_s", f"the heartbeat interval {interval_s} s is longer than the "
                                                       f"window {window_s} s")
        self.window_s, self.interval_s = window_s, interval_s
        self._beats: list[tuple[float, float | None, bool]] = []  # (t, mu, alive), sorted by t
        self._first = math.inf
        self._latest = -math.inf

    def add(self, t: float, throughput: float | None, alive: bool = True) -> None:
        require(finite(t), "t", f"must be a finite time in seconds, got {t!r}")
        if throughput is not None:
            non_negative("throughput", throughput)
        bisect.insort(self._beats, (t, throughput, alive), key=lambda b: b[0])
        self._first, self._latest = min(self._first, t), max(self._latest, t)
        del self._beats[:bisect.bisect_right(self._beats, self._latest - self.window_s, key=lambda b: b[0])]

    def _window(self, now: float) -> list[tuple[float, float | None, bool]]:
        require(finite(now), "now", f"must be a finite time in seconds, got {now!r}")
        lo = bisect.bisect_right(self._beats, now - self.window_s, key=lambda b: b[0])
        return self._beats[lo:bisect.bisect_right(self._beats, now, key=lambda b: b[0])]

    def throughput(self, now: float) -> float | None:
        """Mean ``mu`` reported by live beats in the window; None when none reported one.

        Dead beats do not pull the mean down: absence is ``availability``'s business, and the scheduler
        uses ``a_i * mu_i``, which would count it twice.
        """
        reported = [mu for _, mu, alive in self._window(now) if alive and mu is not None]
        return fmean(reported) if reported else None

    def availability(self, now: float) -> float:
        """Live beats seen over beats expected in the window, clipped to [0, 1].

        A worker first heard less than a window ago is expected to have sent beats only since then.
        """
        seen = sum(alive for _, _, alive in self._window(now))
        if self._first == math.inf:
            return 0.0  # never heard from
        span = min(self.window_s, now - self._first + self.interval_s)
        return min(1.0, seen / max(1, math.floor(span / self.interval_s + 1e-9)))


def accepted_rate(events: Sequence[tuple[float, int]], *, now: float, window_s: float, since: float,
                  min_span_s: float) -> float | None:
    """``mu_i(t)`` as the site measures it: trajectories accepted from the worker per second over the window
    ``(max(now - window_s, since), now]``, ``since`` being when it started on the job. ``events`` are
    ``(time, records accepted)``. None while the span is shorter than ``min_span_s`` or nothing was accepted
    in it: a worker's own figure (its heartbeats, its calibration) stands in until then.
    """
    positive("window_s", window_s)
    non_negative("min_span_s", min_span_s)
    start = max(now - window_s, since)
    span = now - start
    accepted = sum(n for t, n in events if start < t <= now)
    if span < min_span_s or accepted <= 0:
        return None
    return accepted / span


@dataclass(frozen=True)
class Decision:
    activate: tuple[int, ...]
    release: tuple[int, ...]
    reason: str


class HysteresisController:
    """Low-frequency adjustment of the active set, appendix C.2.1.

    Acts only on deviations that last: when capacity has stayed below the target for ``interval_s`` it
    activates the cheapest standby workers by unit cost to cover the deficit; when it has stayed above
    ``target * (1 + release_margin)`` for ``interval_s`` it releases the workers with the highest unit
    cost, never going below the target. Any return into the band resets the clock, so noise shorter than
    the interval does nothing; after acting, the remaining deviation must again last a full interval.
    ``capacity`` is the caller's ``sum a_i mu_i`` of the active set (``pool_capacity``), counting workers
    it already activated; ``now`` is the caller's clock.
    """

    def __init__(self, interval_s: float, release_margin: float) -> None:
        positive("interval_s", interval_s)
        non_negative("release_margin", release_margin)
        self.interval_s, self.release_margin = interval_s, release_margin
        self._below_since: float | None = None
        self._above_since: float | None = None

    def state(self) -> dict[str, float | None]:
        """The two clocks (since when below the target, since when above the margin), to keep between runs."""
        return {"below_since": self._below_since, "above_since": self._above_since}

    def restore(self, *, below_since: float | None, above_since: float | None) -> None:
        """Take back clocks saved by ``state()`` (another process's controller, say)."""
        for field, value in (("below_since", below_since), ("above_since", above_since)):
            require(value is None or finite(value), field, f"must be a finite time or None, got {value!r}")
        self._below_since, self._above_since = below_since, above_since

    def decide(self, now: float, capacity: float, target: float, standby: Sequence[Candidate],
               active: Sequence[Candidate]) -> Decision:
        require(finite(now), "now", f"must be a finite time in seconds, got {now!r}")
        non_negative("capacity", capacity)
        positive("target", target)
        state = f"capacity {capacity:.4g} vs target {target:.4g} traj/s"
        if capacity < target:
            self._above_since = None
            if self._below_since is None or now < self._below_since:
                self._below_since = now
            since = self._below_since
            if now - since < self.interval_s:
                return Decision((), (), f"{state}: below for {now - since:.0f} s of {self.interval_s:.0f} s, waiting")
            self._below_since = now
            measured = [c for c in standby if c.throughput]
            pick = greedy_by_unit_cost(measured, target - capacity)
            skipped = f"; {len(standby) - len(measured)} unmeasured standby skipped" if len(measured) < len(standby) \
                else ""
            if not pick.worker_ids:
                return Decision((), (), f"{state}: below for {self.interval_s:.0f} s, no standby to activate{skipped}")
            short = f", still {pick.shortfall:.4g} short" if pick.shortfall > 0 else ""
            return Decision(pick.worker_ids, (), f"{state}: below for {self.interval_s:.0f} s, activating "
                                                 f"{len(pick.worker_ids)} (+{pick.throughput:.4g}){short}{skipped}")
        if capacity > target * (1 + self.release_margin):
            self._below_since = None
            if self._above_since is None or now < self._above_since:
                self._above_since = now
            since = self._above_since
            if now - since < self.interval_s:
                return Decision((), (), f"{state}: above the margin for {now - since:.0f} s of "
                                        f"{self.interval_s:.0f} s, waiting")
            self._above_since = now
            left, release = capacity, []
            adding = (c for c in checked_candidates(active, need_throughput=False) if c.effective_throughput > 0)
            by_cost = sorted(adding, key=lambda c: (-c.price_per_hour / c.effective_throughput, c.worker_id))
            for c in by_cost:
                if left - c.effective_throughput >= target:
                    release.append(c.worker_id)
                    left -= c.effective_throughput
            if not release:
                return Decision((), (), f"{state}: above the margin for {self.interval_s:.0f} s, but releasing "
                                        f"anyone would drop below the target")
            return Decision((), tuple(release), f"{state}: above the margin for {self.interval_s:.0f} s, releasing "
                                                f"{len(release)}, priciest per unit first (-> {left:.4g})")
        self._below_since = self._above_since = None
        return Decision((), (), f"{state}: within the band")

"""The agent's reconnection waits and its engine warm-up: what brings a restarted or cut-off agent back fast."""

from __future__ import annotations

import itertools
import sys

from worker_agent.connection import reconnect_delays
from worker_agent.engines import warm_imports


def test_reconnect_waits_are_a_quarter_to_half_of_the_time_away_up_to_the_cap():
    waits = list(itertools.islice(reconnect_delays(first=1.0, cap=30.0), 60))
    away = [0.0, *itertools.accumulate(waits)]
    assert all(0.5 * min(30.0, 0.5 * max(1.0, a)) <= w <= min(30.0, 0.5 * max(1.0, a)) + 1e-9
               for w, a in zip(waits, away, strict=False))
    assert waits[-1] >= 15.0 and max(waits) <= 30.0
    assert len({round(w, 6) for w in waits[-20:]}) == 20  # jittered at the cap too, not 30 s each


def test_the_time_away_is_read_from_the_clock_so_slow_attempts_count():
    """An attempt that hangs (a dead link: the websocket's open timeout) is time away too: after 100 s spent in
    attempts the next wait is 25-50 s (capped), not a quarter of the few seconds waited."""
    now = [0.0]
    delays = reconnect_delays(first=1.0, cap=1e9, clock=lambda: now[0])
    assert 0.25 <= next(delays) <= 0.5
    now[0] = 100.0
    assert 25.0 <= next(delays) <= 50.0


def test_the_first_attempt_after_an_outage_comes_within_half_the_outage_again():
    for _ in range(200):  # random waits: the bound holds for every draw
        attempts = list(itertools.accumulate(itertools.islice(reconnect_delays(first=1.0, cap=1e9), 80)))
        for outage in (0.3, 1.0, 3.0, 10.0, 60.0, 600.0):
            first_after = next(a for a in attempts if a >= outage)
            assert first_after <= 1.5 * max(outage, 1.0), (outage, first_after)


def test_a_fleet_that_lost_the_site_together_does_not_come_back_in_step():
    firsts = {round(next(itertools.islice(reconnect_delays(), 5, None)), 6) for _ in range(50)}
    assert len(firsts) > 40


def first_attempts_after(outage: float, schedule, agents: int = 100) -> list[float]:
    """When each of ``agents``, all cut off at 0 by the same outage, first tries again once the site is back at
    ``outage`` (each attempt before that fails at once, as a refused connection does)."""
    out = []
    for _ in range(agents):
        now = [0.0]
        delays = schedule(lambda now=now: now[0])
        while now[0] < outage:
            now[0] += next(delays)
        out.append(now[0])
    return sorted(out)


def most_in_one_window(times: list[float], window: float) -> int:
    return max(sum(1 for t in times if start <= t < start + window) for start in times)


def test_a_hundred_agents_that_lost_the_site_together_come_back_spread_not_clustered():
    """100 agents cut off by one outage (the site restarted, a partition) try again spread over the span their
    waits allow (up to half the outage, at most the cap): no tenth of that span holds more than 40 of them
    (evenly spread: 10; the largest in 100 draws of each case below: 29), every one is back within 1.5 x the
    outage, and their very first waits (the instant the link dropped) are spread the same way. The same count
    for waits without jitter (doubling from 1 s: the usual back-off) is all 100 in one window."""
    cap = 30.0
    ours = lambda clock: reconnect_delays(first=1.0, cap=cap, clock=clock)  # noqa: E731

    def doubling(clock):
        return (2.0**k for k in itertools.count())

    for outage in (1.0, 5.0, 40.0, 300.0, 1000.0):
        spread = min(0.5 * outage, cap)
        back = first_attempts_after(outage, ours)
        assert most_in_one_window(back, spread / 10) <= 40, outage
        assert back[-1] <= outage + spread + 1e-9, outage
        assert most_in_one_window(first_attempts_after(outage, doubling), spread / 10) == 100
    first_waits = sorted(next(ours(lambda: 0.0)) for _ in range(100))
    assert first_waits[0] >= 0.25 and first_waits[-1] <= 0.5
    assert most_in_one_window(first_waits, 0.025) <= 40


def test_warming_the_engine_imports_its_modules_and_never_raises(tmp_path):
    assert warm_imports("hf", str(tmp_path / "no-such-model")) >= 0.0  # a bad base is reported at build time
    assert "transformers" in sys.modules
    assert warm_imports("hf", None) >= 0.0

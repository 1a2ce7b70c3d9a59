"""The agent's reconnection waits and its engine warm-up: what brings a restarted or cut-off agent back fast."""

from __future__ import annotations

import itertools
import sys

from worker_agent.engines import warm_imports
from worker_agent.session import reconnect_delays


def test_reconnect_waits_are_a_quarter_to_half_of_the_time_away_up_to_the_cap():
    waits = list(itertools.islice(reconnect_delays(first=1.0, cap=30.0), 60))
    away = [0.0, *itertools.accumulate(waits)]
    assert all(min(30.0, 0.25 * max(1.0, a)) <= w <= min(30.0, 0.5 * max(1.0, a)) + 1e-9
               for w, a in zip(waits, away, strict=False))
    assert waits[-1] >= 7.5 and max(waits) <= 30.0


def test_the_first_attempt_after_an_outage_comes_within_half_the_outage_again():
    for _ in range(200):  # random waits: the bound holds for every draw
        attempts = list(itertools.accumulate(itertools.islice(reconnect_delays(first=1.0, cap=1e9), 80)))
        for outage in (0.3, 1.0, 3.0, 10.0, 60.0, 600.0):
            first_after = next(a for a in attempts if a >= outage)
            assert first_after <= 1.5 * max(outage, 1.0), (outage, first_after)


def test_a_fleet_that_lost_the_site_together_does_not_come_back_in_step():
    firsts = {round(next(itertools.islice(reconnect_delays(), 5, None)), 6) for _ in range(50)}
    assert len(firsts) > 40


def test_warming_the_engine_imports_its_modules_and_never_raises(tmp_path):
    assert warm_imports("hf", str(tmp_path / "no-such-model")) >= 0.0  # a bad base is reported at build time
    assert "transformers" in sys.modules
    assert warm_imports("hf", None) >= 0.0

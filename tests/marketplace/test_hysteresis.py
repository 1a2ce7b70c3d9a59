"""Heartbeat windows and the hysteresis controller (section 4.3, appendix C.2.1), in simulated time."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from marketplace.core.activation import Candidate, pool_capacity
from marketplace.core.controller import Decision, HeartbeatWindow, HysteresisController
from marketplace.core.provisioning import ProvisioningInputError

# ---- heartbeat windows ---------------------------------------------------------------------------------


def test_full_window_by_hand() -> None:
    window = HeartbeatWindow(window_s=60.0, interval_s=10.0)
    for t, mu in zip(range(0, 60, 10), [1.0, 2.0, 3.0, 4.0, 5.0, 6.0], strict=True):
        window.add(t, mu)

    # at 55 s the window (-5, 55] holds all six beats: mean (1 + ... + 6) / 6 = 21 / 6 = 3.5; 6 of 6 expected
    assert window.throughput(55.0) == pytest.approx(3.5)
    assert window.availability(55.0) == 1.0
    # at 100 s the window (40, 100] holds the beat at 50 only: 1 of 6
    assert window.throughput(100.0) == 6.0
    assert window.availability(100.0) == pytest.approx(1 / 6)
    # at 200 s nothing is left
    assert (window.throughput(200.0), window.availability(200.0)) == (None, 0.0)


def test_missed_and_dead_beats_lower_availability_not_throughput() -> None:
    window = HeartbeatWindow(window_s=60.0, interval_s=10.0)
    window.add(60.0, 4.0)
    window.add(70.0, 2.0)
    window.add(80.0, 100.0, alive=False)  # the agent says it is not generating: its number is not a rate
    window.add(100.0, None)  # alive, nothing measured yet
    window.add(110.0, 6.0)
    # (50, 110]: beats at 60, 70, 100, 110 alive (90 missed, 80 dead) -> 4 of 6; mean of 4, 2, 6 = 4
    assert window.availability(110.0) == pytest.approx(4 / 6)
    assert window.throughput(110.0) == pytest.approx(4.0)


def test_a_new_worker_is_expected_to_beat_only_since_it_appeared() -> None:
    window = HeartbeatWindow(window_s=60.0, interval_s=10.0)
    window.add(1000.0, 3.0)
    assert window.availability(1000.0) == 1.0  # one beat expected so far, one seen
    window.add(1010.0, 3.0)
    window.add(1020.0, 3.0)
    # at 1025 s it has been heard for 25 s: floor((25 + 10) / 10) = 3 beats expected, 3 seen
    assert window.availability(1025.0) == 1.0
    assert HeartbeatWindow(window_s=60.0, interval_s=10.0).availability(5.0) == 0.0  # never heard from


def test_beats_may_arrive_out_of_order() -> None:
    window = HeartbeatWindow(window_s=30.0, interval_s=10.0)
    for t, mu in [(20.0, 3.0), (0.0, 1.0), (10.0, 2.0)]:
        window.add(t, mu)

    assert window.throughput(25.0) == pytest.approx(2.0)  # (-5, 25]: 1, 2, 3
    assert window.availability(25.0) == 1.0


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: HeartbeatWindow(window_s=0.0, interval_s=1.0), "window_s"),
        (lambda: HeartbeatWindow(window_s=10.0, interval_s=-1.0), "interval_s"),
        (lambda: HeartbeatWindow(window_s=10.0, interval_s=20.0), "interval_s"),
        (lambda: HeartbeatWindow(window_s=60.0, interval_s=10.0).add(float("nan"), 1.0), "t"),
        (lambda: HeartbeatWindow(window_s=60.0, interval_s=10.0).add(0.0, -1.0), "throughput"),
        (lambda: HeartbeatWindow(window_s=60.0, interval_s=10.0).availability(float("inf")), "now"),
        (lambda: HysteresisController(interval_s=0.0, release_margin=0.1), "interval_s"),
        (lambda: HysteresisController(interval_s=10.0, release_margin=-0.1), "release_margin"),
        (lambda: HysteresisController(10.0, 0.1).decide(0.0, -1.0, 10.0, [], []), "capacity"),
        (lambda: HysteresisController(10.0, 0.1).decide(0.0, 5.0, 0.0, [], []), "target"),
    ],
)
def test_bad_inputs_name_the_field(make: Callable[[], object], field: str) -> None:
    with pytest.raises(ProvisioningInputError) as err:
        make()
    assert err.value.field == field


@given(beats=st.lists(st.tuples(st.floats(0, 500), st.one_of(st.none(), st.floats(0, 50)), st.booleans()),
                      max_size=60),
       after=st.floats(0, 100))
@settings(max_examples=200, deadline=None)
def test_window_statistics_match_a_direct_count(beats: list, after: float) -> None:
    window = HeartbeatWindow(window_s=60.0, interval_s=5.0)
    for beat in beats:  # in any order
        window.add(*beat)
    now = max((t for t, _, _ in beats), default=0.0) + after  # queries come at or after the latest beat
    inside = [(t, mu, alive) for t, mu, alive in beats if now - 60.0 < t <= now]
    reported = [mu for _, mu, alive in inside if alive and mu is not None]

    assert window.throughput(now) == (pytest.approx(sum(reported) / len(reported)) if reported else None)
    if beats:
        heard_for = min(60.0, now - min(t for t, _, _ in beats) + 5.0)
        expected = max(1, int(heard_for / 5.0 + 1e-9))
        assert window.availability(now) == pytest.approx(min(1.0, sum(a for _, _, a in inside) / expected))
    assert 0.0 <= window.availability(now) <= 1.0


# ---- the controller in simulated time ------------------------------------------------------------------
# target 10 traj/s, act after 30 s, release only above 10 * 1.2 = 12 traj/s

TARGET, INTERVAL, MARGIN = 10.0, 30.0, 0.2
A, B, C = Candidate(1, 1.0, 4.0), Candidate(2, 1.2, 4.0), Candidate(3, 4.0, 4.0)  # rho 0.25, 0.3, 1.0
D, E, F = Candidate(4, 0.5, 3.0), Candidate(5, 3.0, 5.0), Candidate(6, 2.0, 10.0)  # rho 0.17, 0.6, 0.2
G = Candidate(7, 4.0, 8.0)  # rho 0.5


def simulate(active: list[Candidate], standby: list[Candidate], until: float,
             noise: Callable[[float], float] = lambda t: 0.0) -> list[tuple[float, Decision]]:
    """Tick once a second; capacity is the active set's plus ``noise(t)``; decisions are applied at once."""
    controller, acted = HysteresisController(interval_s=INTERVAL, release_margin=MARGIN), []
    active, standby = list(active), list(standby)
    for t in range(int(until) + 1):
        capacity = max(0.0, pool_capacity(active) + noise(t))
        decision = controller.decide(float(t), capacity, TARGET, standby, active)
        if decision.activate or decision.release:
            acted.append((float(t), decision))
            active = [c for c in active if c.worker_id not in decision.release]
            active += [c for c in standby if c.worker_id in decision.activate]
            standby = [c for c in standby if c.worker_id not in decision.activate]
    return acted


def test_noise_shorter_than_the_interval_does_nothing() -> None:
    # capacity 12 (in the band); dips to 7 for 29 s of every 60 s, and jumps to 17 for 29 s in between
    def noise(t: float) -> float:
        phase = t % 60
        return -5.0 if phase < 29 else (5.0 if 30 <= phase < 59 else 0.0)

    assert simulate([A, B, C], [D, E, F], until=600, noise=noise) == []


def test_a_sustained_drop_activates_the_cheapest_standby_once_at_the_interval_end() -> None:
    # C dies at t = 100: capacity 12 -> 8, deficit 2; by unit cost D (rho 0.17, 3 traj/s) covers it alone
    def noise(t: float) -> float:
        return -4.0 if t >= 100 else 0.0

    acted = simulate([A, B, C], [E, F, D], until=600, noise=noise)

    assert len(acted) == 1
    t, decision = acted[0]
    assert t == 100 + INTERVAL
    assert (decision.activate, decision.release) == ((D.worker_id,), ())
    assert "activating 1" in decision.reason


def test_a_larger_deficit_takes_the_cheapest_unit_costs_in_order() -> None:
    # capacity 4 (only A) for 30 s: deficit 6 -> D (3, rho 0.17) then F (10, rho 0.2) -> 17; E (rho 0.6) stays
    controller = HysteresisController(interval_s=INTERVAL, release_margin=MARGIN)
    first = controller.decide(0.0, 4.0, TARGET, [E, F, D], [A])
    assert (first.activate, first.release) == ((), ())
    assert "waiting" in first.reason
    decision = controller.decide(30.0, 4.0, TARGET, [E, F, D], [A])

    assert decision.activate == (D.worker_id, F.worker_id)


def test_sustained_excess_releases_the_priciest_per_unit_but_stays_at_the_target() -> None:
    # capacity 4 + 4 + 4 + 8 = 20 > 12 from t = 0. At t = 30, by unit cost, highest first:
    #   C (1.0):  20 - 4 = 16 >= 10, release;   G (0.5): 16 - 8 = 8 < 10, keep;
    #   B (0.3):  16 - 4 = 12 >= 10, release;   A (0.25): 12 - 4 = 8 < 10, keep  -> A + G = 12 traj/s
    acted = simulate([A, B, C, G], [], until=300)

    assert len(acted) == 1
    t, decision = acted[0]
    assert t == INTERVAL
    assert (decision.activate, decision.release) == ((), (C.worker_id, B.worker_id))
    assert pool_capacity([A, G]) == 12.0 >= TARGET


def test_a_deficit_with_nobody_on_standby_says_so() -> None:
    controller = HysteresisController(interval_s=INTERVAL, release_margin=MARGIN)
    controller.decide(0.0, 5.0, TARGET, [Candidate(9, 1.0, None)], [A])
    decision = controller.decide(30.0, 5.0, TARGET, [Candidate(9, 1.0, None)], [A])

    assert (decision.activate, decision.release) == ((), ())
    assert "no standby" in decision.reason and "1 unmeasured standby skipped" in decision.reason


def test_the_clocks_survive_a_restart() -> None:
    # a deficit starts at t = 0 in one process; another takes over at t = 20 with the saved clocks
    first = HysteresisController(interval_s=INTERVAL, release_margin=MARGIN)
    first.decide(0.0, 8.0, TARGET, [D], [A, B])
    saved = first.state()
    assert saved == {"below_since": 0.0, "above_since": None}

    second = HysteresisController(interval_s=INTERVAL, release_margin=MARGIN)
    second.restore(**saved)
    assert second.decide(20.0, 8.0, TARGET, [D], [A, B]).activate == ()
    assert second.decide(30.0, 8.0, TARGET, [D], [A, B]).activate == (D.worker_id,)
    assert second.state() == {"below_since": 30.0, "above_since": None}
    with pytest.raises(ProvisioningInputError, match="^above_since: "):
        second.restore(below_since=None, above_since=float("nan"))


@given(levels=st.lists(st.sampled_from([5.0, 9.99, 10.0, 11.0, 12.0, 12.01, 20.0]), min_size=1, max_size=200),
       interval=st.integers(1, 20))
@settings(max_examples=150, deadline=None)
def test_the_controller_acts_exactly_when_a_deviation_has_lasted(levels: list[float], interval: int) -> None:
    # H (0.5 traj/s at rho 6) can always go when capacity exceeds 12, and D, E, F can always come
    controller = HysteresisController(interval_s=float(interval), release_margin=MARGIN)
    standby, active = [D, E, F], [A, B, C, G, Candidate(8, 3.0, 0.5)]
    last_action = -10**9
    for now, capacity in enumerate(levels):
        decision = controller.decide(float(now), capacity, TARGET, standby, active)
        recent = levels[max(0, now - interval):now + 1]
        lasted = now >= interval and now - last_action >= interval
        below = lasted and all(c < TARGET for c in recent)
        above = lasted and all(c > TARGET * (1 + MARGIN) for c in recent)
        assert bool(decision.activate) == below, (now, recent, decision.reason)
        assert bool(decision.release) == above, (now, recent, decision.reason)
        if decision.release:
            assert 8 in decision.release  # the priciest per unit goes first
            freed = sum(c.effective_throughput for c in active if c.worker_id in decision.release)
            assert capacity - freed >= TARGET
        if decision.activate or decision.release:
            last_action = now

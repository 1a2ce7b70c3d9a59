"""Chain scoring, assembly, tails, routes and repair (appendix C.3), and the relay bandwidth average, against
hand-computed values."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dataplane.broadcast.chains import (
    BANDWIDTH_EWMA,
    LEARNER,
    ChainPlan,
    ScoreParams,
    WorkerStats,
    assemble_chains,
    children,
    hop_was_bottleneck,
    measured_bandwidth,
    n_chains,
    parents,
    place_tails,
    repair,
    reroute,
    route,
    routes,
    score_terms,
    scores,
    star_plan,
)

NOW = 10_000.0
sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
from bench_publication import place_tails_plainly  # noqa: E402


def worker(worker_id, bw=10e6, successes=10, failures=0, age=0.0, failed_ago=None):
    return WorkerStats(worker_id, bw, successes=successes, failures=failures, last_seen=NOW - age,
                       last_failure_at=None if failed_ago is None else NOW - failed_ago)


def test_score_terms_by_hand():
    w = worker(1, bw=5e6, successes=4, failures=1, age=150, failed_ago=60)
    terms = score_terms(w, best_bandwidth_bps=10e6, now=NOW)
    assert terms == pytest.approx({"speed": 0.5, "success": 0.4, "stability": 2 / 3, "decay": 0.75})
    # 0.75 * (0.5*0.5 + 0.35*0.4 + 0.15*2/3) = 0.75 * 0.49 = 0.3675
    assert scores([w, worker(2)], now=NOW)[1] == pytest.approx(0.3675)
    assert scores([worker(2)], now=NOW)[2] == pytest.approx(1.0)


def test_saturation_thresholds_and_forgetting():
    p = ScoreParams()
    assert score_terms(worker(1, successes=25), best_bandwidth_bps=10e6, now=NOW)["success"] == 1.0
    assert score_terms(worker(1, failures=5, failed_ago=10), best_bandwidth_bps=10e6, now=NOW)["stability"] == 0.0
    old = worker(1, failures=5, failed_ago=p.decay_window_s + 1)
    assert score_terms(old, best_bandwidth_bps=10e6, now=NOW)["stability"] == 1.0
    assert score_terms(worker(1, age=900), best_bandwidth_bps=10e6, now=NOW)["decay"] == 0.0
    assert score_terms(worker(1, bw=None), best_bandwidth_bps=10e6, now=NOW)["speed"] == 0.0


def test_n_chains_is_floor_of_bandwidth_ratio_at_least_one():
    assert n_chains(800e6 / 8, 100e6 / 8) == 8
    assert n_chains(350, 100) == 3
    assert n_chains(50, 100) == 1
    with pytest.raises(ValueError):
        n_chains(100, 0)


def test_top_scores_are_seeds_and_the_rest_round_robin_in_rank_order():
    pool = [worker(i, bw=i * 1e6) for i in range(1, 9)]  # worker 8 fastest
    plan = assemble_chains(pool, n_ch=3, now=NOW)
    assert plan.chains == ((8, 5, 2), (7, 4, 1), (6, 3))
    assert plan.rollout_only == ()
    assert parents(plan)[8] is LEARNER and parents(plan)[5] == 8 and parents(plan)[3] == 6
    assert children(plan)[8] == 5 and children(plan)[3] is None


def test_more_chains_than_workers_gives_one_worker_chains():
    assert assemble_chains([worker(1), worker(2)], n_ch=5, now=NOW).chains == ((1,), (2,))


def test_degraded_relays_move_to_tails_then_become_rollout_only():
    pool = [worker(i, bw=i * 1e6) for i in range(1, 7)]
    healthy = assemble_chains(pool, n_ch=2, now=NOW)
    assert healthy.chains == ((6, 4, 2), (5, 3, 1))
    # The fastest worker fails 3 times: no longer a seed; it goes after every healthy worker.
    pool[5] = worker(6, bw=6e6, failures=3, failed_ago=30)
    degraded = assemble_chains(pool, n_ch=2, now=NOW)
    assert degraded.chains == ((5, 3, 1), (4, 2, 6))
    # Three more failures: out of forwarding altogether, but still listed (it fetches from the learner).
    pool[5] = worker(6, bw=6e6, failures=6, failed_ago=30)
    dropped = assemble_chains(pool, n_ch=2, now=NOW)
    assert dropped.chains == ((5, 3, 1), (4, 2)) and dropped.rollout_only == (6,)
    assert parents(dropped)[6] is LEARNER and children(dropped)[6] is None


def test_repair_excises_the_dead_relay_and_reattaches_its_tail_to_its_parent():
    plan = ChainPlan(chains=((8, 5, 2), (7, 4, 1)), rollout_only=(9,))
    fixed, moves = repair(plan, 5)
    assert fixed.chains == ((8, 2), (7, 4, 1)) and moves == [(2, 8)]
    fixed, moves = repair(plan, 7)  # a dead seed: its child now pulls from the learner
    assert fixed.chains == ((8, 5, 2), (4, 1)) and moves == [(4, LEARNER)]
    fixed, moves = repair(plan, 1)  # a dead tail: nobody moves
    assert fixed.chains == ((8, 5, 2), (7, 4)) and moves == []
    fixed, moves = repair(plan, 9)
    assert fixed.rollout_only == () and fixed.chains == plan.chains and moves == []
    fixed, moves = repair(ChainPlan(chains=((3,), (4,))), 3)
    assert fixed.chains == ((4,),) and moves == []


def test_star_plan_puts_everyone_under_the_learner():
    plan = star_plan([3, 1, 2])
    assert parents(plan) == {3: LEARNER, 1: LEARNER, 2: LEARNER}


def test_route_names_parent_and_child_and_nothing_for_rollout_only_workers():
    plan = ChainPlan(chains=((8, 5, 2), (7,)), rollout_only=(9,))
    assert route(plan, 8) == (LEARNER, 5) and route(plan, 5) == (8, 2) and route(plan, 2) == (5, None)
    assert route(plan, 7) == (LEARNER, None)
    assert route(plan, 9) is None and route(plan, 42) is None


def test_routes_agree_with_route_for_every_worker():
    plan = ChainPlan(chains=((8, 5, 2), (7,), (4, 1)), rollout_only=(9,))
    assert routes(plan) == {w: route(plan, w) for c in plan.chains for w in c}


@given(st.lists(st.lists(st.integers(0, 30), min_size=1, max_size=5), max_size=6),
       st.lists(st.integers(100, 130), max_size=12, unique=True), st.sets(st.integers(0, 30)), st.integers(1, 9))
def test_place_tails_equals_the_rule_stated_plainly(chain_lists, tails, relays, n_ch):
    plan = ChainPlan(chains=tuple(tuple(c) for c in chain_lists))
    assert place_tails(plan, tails, relays=relays, n_ch=n_ch) == place_tails_plainly(
        plan, tails, relays=relays, n_ch=n_ch)


def test_tails_end_the_shortest_relay_chains_then_start_chains_then_fetch_over_http():
    relays = {1, 2, 3}
    plan = ChainPlan(chains=((1, 2), (3,)), rollout_only=(6,))
    # One tail per chain, shortest chain first; the third finds every chain capped and n_ch reached.
    placed = place_tails(plan, [10, 11, 12], relays=relays, n_ch=2)
    assert placed.chains == ((1, 2, 11), (3, 10)) and placed.rollout_only == (6, 12)
    # With room for more chains, a tail left over starts one of its own (it pulls from the learner).
    assert place_tails(plan, [10, 11, 12], relays=relays, n_ch=3).chains == ((1, 2, 11), (3, 10), (12,))
    # No relay at all: each tail is a one-worker chain, up to n_ch.
    alone = place_tails(ChainPlan(chains=()), [10, 11, 12], relays=set(), n_ch=2)
    assert alone.chains == ((10,), (11,)) and alone.rollout_only == (12,)


def test_bandwidth_average_takes_only_transfers_long_enough_to_measure():
    assert measured_bandwidth(None, total_bytes=10_000_000, seconds=2.0) == pytest.approx(5e6)  # first: as is
    # 0.7 * 5e6 + 0.3 * 10e6 = 6.5e6
    assert BANDWIDTH_EWMA == 0.3
    assert measured_bandwidth(5e6, total_bytes=10_000_000, seconds=1.0) == pytest.approx(6.5e6)
    assert measured_bandwidth(5e6, total_bytes=40_000, seconds=0.02) == 5e6  # latency, not bandwidth
    assert measured_bandwidth(None, total_bytes=40_000, seconds=0.02) is None
    assert measured_bandwidth(5e6, total_bytes=0, seconds=3.0) == 5e6  # a manifest without a size


def test_a_hop_lowers_its_relays_bandwidth_only_when_it_was_the_bottleneck():
    # The harsh WAN bench: a seed had the 16.4 MB version 4.9 s after publication (its share of B0), its child 0.6 s
    # later. 16.4 MB / 5.5 s = 3.0 MB/s, half the seed's 6.25 MB/s link: what the seed received, not what it sends.
    link = 6.25e6
    assert hop_was_bottleneck(5.5, 4.9) is False and hop_was_bottleneck(5.5, None) is None
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=5.5, parent_seconds=4.9,
                              registered_bps=link) is None  # starved by its own parent: nothing learnt
    assert measured_bandwidth(link, total_bytes=16_400_000, seconds=5.5, parent_seconds=4.9,
                              registered_bps=link) == link
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=5.5, parent_seconds=None,
                              registered_bps=link) is None  # the parent's own install unknown: cannot tell
    # The child lagged its parent by far more than a pipelined hop: the relay's uplink held it back.
    assert hop_was_bottleneck(8.0, 2.6) is True
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=8.0, parent_seconds=2.6,
                              registered_bps=link) == pytest.approx(2.05e6)
    assert measured_bandwidth(4e6, total_bytes=16_400_000, seconds=8.0, parent_seconds=2.6,
                              registered_bps=link) == pytest.approx(0.7 * 4e6 + 0.3 * 2.05e6)
    # A relay lowered once rises again when a child keeps pace at a higher rate (it proved it sends that fast) ...
    assert measured_bandwidth(2e6, total_bytes=16_400_000, seconds=4.1, parent_seconds=3.9,
                              registered_bps=link) == pytest.approx(0.7 * 2e6 + 0.3 * 4e6)
    # ... never past the provider's registered figure, whoever measured more.
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=1.0, parent_seconds=0.9,
                              registered_bps=link) == link
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=1.0, parent_seconds=None,
                              registered_bps=link) == link
    # ... nor for a child held back by its own link: harsh's 10 Mbit/s worker took 15.2 s behind a parent at 3.8 s
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=15.2, parent_seconds=3.8, registered_bps=link,
                              child_bps=1.25e6) is None
    assert measured_bandwidth(None, total_bytes=16_400_000, seconds=15.2, parent_seconds=3.8, registered_bps=link,
                              child_bps=link) == pytest.approx(16_400_000 / 15.2)  # a fast child: the parent's fault
    # Short lags are a hop's part time and round trips: 1 s at least, a quarter of the parent's time on long ones.
    assert hop_was_bottleneck(1.9, 1.0) is False and hop_was_bottleneck(2.1, 1.0) is True
    assert hop_was_bottleneck(24.0, 20.0) is False and hop_was_bottleneck(26.0, 20.0) is True


def test_reroute_moves_only_the_reporter_and_what_hangs_below_it():
    plan = ChainPlan(chains=((1, 2, 3), (4, 5)), rollout_only=(9,))
    relays = {1, 2, 3, 4, 5}
    # 3 reports 2 (not a seed): another chain's relay tail takes it (idle uplink), before the learner's spare slot.
    new, moves = reroute(plan, 3, relays=relays, learner_slots=3)
    assert new == ChainPlan(chains=((1, 2), (4, 5, 3)), rollout_only=(9,)) and moves == [(3, 5)]
    # 2 reports the seed 1: the learner (its seed's own parent) while it has a slot beyond the plan's chains; 2 keeps
    # its child 3, and 1 keeps its place.
    new, moves = reroute(plan, 2, relays=relays, learner_slots=3)
    assert new == ChainPlan(chains=((1,), (4, 5), (2, 3)), rollout_only=(9,)) and moves == [(2, LEARNER)]
    # no spare slot at the learner: the other chain's tail
    new, moves = reroute(plan, 2, relays=relays, learner_slots=2)
    assert new.chains == ((1,), (4, 5, 2, 3)) and moves == [(2, 5)]
    # a tail that cannot serve (no relay address) is no parent; then the learner's slot, else nothing (HTTP)
    assert reroute(plan, 3, relays={1, 2, 3, 4}, learner_slots=3)[1] == [(3, LEARNER)]
    assert reroute(plan, 3, relays={1, 2, 3, 4}, learner_slots=2) is None
    # tails that hold the version first, then the shortest chain
    wide = ChainPlan(chains=((1, 2), (4, 5, 6), (7,), (8,)))
    assert reroute(wide, 2, relays={1, 2, 4, 5, 6, 7, 8}, learner_slots=4)[1] == [(2, 7)]
    assert reroute(wide, 2, relays={1, 2, 4, 5, 6, 7, 8}, learner_slots=4, holding={6})[1] == [(2, 6)]
    # a seed's or a rollout-only worker's word: its parent is the learner, nothing to reroute here
    assert reroute(plan, 1, relays=relays, learner_slots=3) is None
    assert reroute(plan, 9, relays=relays, learner_slots=3) is None


def test_a_worker_that_failed_audits_scores_in_proportion_to_its_pass_rate():
    honest = WorkerStats(1, bandwidth_bps=1e8, successes=10, last_seen=NOW)
    caught = WorkerStats(2, bandwidth_bps=1e8, successes=10, last_seen=NOW, audit_pass_rate=0.25)
    score = scores([honest, caught], now=NOW)
    assert score[1] == pytest.approx(1.0) and score[2] == pytest.approx(0.25)
    assert assemble_chains([caught, honest], n_ch=1, now=NOW).chains == ((1, 2),)  # the honest one seeds

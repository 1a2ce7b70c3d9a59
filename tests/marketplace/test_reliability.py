"""The long-run reliability r_i (marketplace/core/reliability.py) against hand-computed values, and its effect on
activation: a flaky cheap worker's unit cost is what it delivers (core/activation.py)."""

from __future__ import annotations

import math

import pytest

from marketplace.core import activation
from marketplace.core.provisioning import ProvisioningInputError
from marketplace.core.reliability import PRIOR_S, Record, reliability

DAY = 86_400.0


def test_a_new_worker_is_fully_reliable():
    r = reliability(Record(connected_s=0.0, sessions_ended=0), horizon_s=300)
    assert (r.value, r.stay, r.audits, r.relays, r.delivery) == (1.0, 1.0, 1.0, 1.0, 1.0)


def test_each_part_is_its_smoothed_rate_and_the_figure_their_product():
    # a week connected 6 days, cut 12 times; 8 audits passed, 2 failed; 10 relays, 1 broken; 5 kept, 1 silent
    record = Record(connected_s=6 * DAY, sessions_ended=12, audits_passed=8, audits_failed=2, relays_ok=10,
                    relays_broken=1, activations_kept=5, activations_silent=1, uptime=6 / 7)
    r = reliability(record, horizon_s=600)
    assert r.stay == pytest.approx(math.exp(-600 * 12 / (6 * DAY + PRIOR_S)))
    assert (r.audits, r.relays, r.delivery) == (pytest.approx(10 / 12), pytest.approx(12 / 13), pytest.approx(7 / 8))
    assert r.value == pytest.approx(r.stay * 10 / 12 * 12 / 13 * 7 / 8)
    shown = r.as_dict()
    assert set(shown["parts"]) == {"stay", "audits", "relays", "delivery"} and shown["uptime"] == round(6 / 7, 4)


def test_a_worker_that_leaves_every_hour_is_unlikely_to_stay_a_publication():
    hourly = reliability(Record(connected_s=6 * DAY, sessions_ended=144), horizon_s=600).value
    daily = reliability(Record(connected_s=6 * DAY, sessions_ended=6), horizon_s=600).value
    assert hourly < 0.9 < 0.98 < daily


def test_bad_records_are_refused():
    with pytest.raises(ValueError, match="horizon_s"):
        reliability(Record(connected_s=0, sessions_ended=0), horizon_s=float("nan"))
    with pytest.raises(ValueError, match="record"):
        reliability(Record(connected_s=0, sessions_ended=-1), horizon_s=1)


def test_activation_weighs_throughput_by_reliability():
    # Two workers of 10 traj/s: the flaky one is cheaper per promised unit (0.2 vs 0.3) but delivers half of it.
    flaky = activation.Candidate(1, 2.0, 10.0, availability=1.0, reliability=0.5)
    steady = activation.Candidate(2, 3.0, 10.0, availability=1.0, reliability=1.0)
    assert flaky.effective_throughput == 5.0
    assert activation.greedy_by_unit_cost([flaky, steady], 8.0).worker_ids == (2,)
    assert activation.exact_min_cost([flaky, steady], 8.0).worker_ids == (2,)
    # The short-window a_i alone (r = 1) would have taken the flaky one.
    blind = activation.Candidate(1, 2.0, 10.0, availability=1.0)
    assert activation.exact_min_cost([blind, steady], 8.0).worker_ids == (1,)
    with pytest.raises(ProvisioningInputError, match="reliability"):
        activation.pool_capacity([activation.Candidate(3, 1.0, 1.0, reliability=1.5)])

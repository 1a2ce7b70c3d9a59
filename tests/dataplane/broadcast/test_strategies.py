"""The chain strategies registry (dataplane/broadcast/strategies/): the names jobs may choose, the plans of the
built-ins, the rule for ``N_ch``'s ``Bw_hat``, and the paper's closed forms."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from dataplane.broadcast import BROADCAST_STRATEGIES, strategies
from dataplane.broadcast.chains import ChainPlan, WorkerStats
from dataplane.broadcast.strategies.chain import median_bandwidth
from dataplane.jobs import JobSpec, parse_job_spec

NOW = 1_000.0


def stats(worker_id: int, bw: float) -> WorkerStats:
    return WorkerStats(worker_id, bw, successes=10, last_seen=NOW)


def test_the_job_spec_offers_exactly_the_registered_strategies() -> None:
    assert {"chain", "star-limited", "star-unlimited"} <= set(strategies.names())
    assert strategies.names() == BROADCAST_STRATEGIES
    assert get_args(JobSpec.model_fields["broadcast_strategy"].annotation) == strategies.names()
    with pytest.raises(ValueError, match=f"unknown broadcast strategy 'ring'; one of {', '.join(strategies.names())}$"):
        strategies.get("ring")


def test_every_module_of_the_folder_is_a_registered_strategy() -> None:
    folder = Path(strategies.__file__).parent
    modules = sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__")
    assert sorted(type(strategies.get(name)).__module__.rsplit(".", 1)[1] for name in strategies.names()) == modules


def test_a_name_is_registered_once() -> None:
    class Again(strategies.Strategy):
        name = "chain"

    with pytest.raises(ValueError, match="already registered"):
        strategies.register(Again)
    assert type(strategies.get("chain")).__name__ == "Chain"


def test_stars_send_everyone_to_the_learner_and_only_the_limited_one_is_capped() -> None:
    workers = [stats(3, 10.0), stats(1, 20.0)]
    for name in ("star-limited", "star-unlimited"):
        plan = strategies.get(name).plan(workers, can_relay={1, 3}, b0_bps=100.0, now=NOW)
        assert plan == ChainPlan(chains=(), rollout_only=(3, 1)) and not strategies.get(name).relayed
    assert strategies.get("star-limited").capped and not strategies.get("star-unlimited").capped
    assert strategies.get("chain").relayed and strategies.get("chain").capped


def test_n_ch_divides_b0_by_the_median_over_every_worker_placed_tails_too() -> None:
    """Two relays measured at 4000 B/s, three tails (no relay address) at their registered 1000 B/s: ``Bw_hat``
    is 1000, so B0 = 3000 gives 3 chains, one per tail. The median of the measured relays alone (4000) would
    plan one chain and send two of the tails over HTTP."""
    relays, tails = [stats(1, 4000.0), stats(2, 4000.0)], [stats(3, 1000.0), stats(4, 1000.0), stats(5, 1000.0)]
    assert median_bandwidth(relays + tails) == 1000.0
    plan = strategies.get("chain").plan(relays + tails, can_relay={1, 2}, b0_bps=3000.0, now=NOW)
    assert plan.chains == ((1, 3), (2, 4), (5,)) and plan.rollout_only == ()


def test_chains_with_no_workers_or_no_figures() -> None:
    chain = strategies.get("chain")
    assert chain.plan([], can_relay=set(), b0_bps=1.0, now=NOW) == ChainPlan(chains=())
    unknown = [WorkerStats(1, None, last_seen=NOW), WorkerStats(2, None, last_seen=NOW)]
    assert chain.plan(unknown, can_relay={1, 2}, b0_bps=1.0, now=NOW).chains == ((1, 2),)  # one chain


@pytest.mark.parametrize(("name", "expected"), [("chain", 10.0 + 1 * 1.0), ("star-limited", 20.0),
                                                 ("star-unlimited", 10.0)])
def test_closed_forms_of_section_5_5_1(name: str, expected: float) -> None:
    # 8 equal workers, M = 100 B, Bw = 10 B/s, B0 = 40 B/s (chain: 4 chains of 2; star-limited: 8 x 100 / 40),
    # chunks of 10 B
    assert strategies.get(name).closed_form(8, size=100.0, bw=10.0, b0=40.0, chunk=10.0) == pytest.approx(expected)


def test_a_job_may_name_each_builtin_and_nothing_else() -> None:
    base = {"name": "j", "model_dir": "/m", "task": {"name": "arithmetic"}}
    for name in strategies.names():
        assert parse_job_spec({**base, "broadcast_strategy": name}).broadcast_strategy == name
    with pytest.raises(ValueError, match="broadcast_strategy"):
        parse_job_spec({**base, "broadcast_strategy": "ring"})

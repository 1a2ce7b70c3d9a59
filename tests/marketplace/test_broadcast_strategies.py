"""A chain strategy is one object in a registry that the site and the simulator both plan with: a toy strategy
registered here shapes the site's publication plan and the simulator's broadcast alike."""

from __future__ import annotations

import time

import pytest

from dataplane.broadcast import strategies
from dataplane.broadcast.chains import ChainPlan
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Job, Worker
from simulator.broadcast import closed_form, install_times, plan_for
from simulator.fleet import simulate
from simulator.model import ControlSpec, LearnerSpec, NetSpec, SimConfig, WorkerSpec

from .test_broadcast import make_workers, publish, running_job

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


class Ladder(strategies.Strategy):
    """One chain, highest worker id first: nothing like ``chain``, so a plan of this shape came from here."""

    name = "toy-ladder"
    relayed = True

    def plan(self, workers, *, can_relay, b0_bps, now):
        ids = sorted((w.worker_id for w in workers if w.worker_id in can_relay), reverse=True)
        return ChainPlan(chains=(tuple(ids),) if ids else (),
                         rollout_only=tuple(w.worker_id for w in workers if w.worker_id not in can_relay))

    def closed_form(self, n, *, size, bw, b0, chunk):
        return size / min(bw, b0) + (n - 1) * min(chunk, size) / bw


@pytest.fixture
def ladder():
    strategies.register(Ladder)
    yield strategies.get("toy-ladder")
    strategies.unregister("toy-ladder")


def test_the_site_plans_a_publication_with_a_registered_strategy(ladder, monkeypatch):
    workers = make_workers(3) + make_workers(1, relay=False)
    job = running_job(workers, b0=10**6)  # chain would make 1000 chains of one here
    # A job names a strategy the job spec knew when dataplane.broadcast was imported, which this toy, registered
    # later, is not: every job reads it as its strategy instead (a copy of its settings, unvalidated).
    settings = Job.settings.fget
    monkeypatch.setattr(Job, "settings", property(
        lambda job: settings(job).model_copy(update={"broadcast_strategy": "toy-ladder"})))
    relays = sorted((w.pk for w in workers[:3]), reverse=True)
    assert services.broadcast_plan(job=job, workers=list(Worker.objects.filter(pk__in=[w.pk for w in workers])),
                                   now=time.time()) == ChainPlan(chains=(tuple(relays),), rollout_only=(workers[3].pk,))
    assert publish(job, 1).n_chains == 1
    assert telemetry.load_chain_plan(job.pk, 1).chains == (tuple(relays),)
    assert services.broadcast.relaying(job)


def test_the_simulator_plans_and_times_with_the_same_registered_strategy(ladder):
    bandwidth = {1: 10.0, 2: 10.0, 3: 10.0}
    plan = plan_for("toy-ladder", bandwidth, b0_bps=1000.0)
    assert plan == ChainPlan(chains=((3, 2, 1),))
    times = install_times(plan, bandwidth, size=100.0, chunk=10.0, b0_bps=1000.0)
    assert times == pytest.approx({3: 10.0, 2: 11.0, 1: 12.0})  # one flow line: a chunk's delay per hop
    assert closed_form("toy-ladder", 3, size=100.0, bw=10.0, b0=1000.0, chunk=10.0) == pytest.approx(12.0)
    config = SimConfig([WorkerSpec(i, 0.35, 0.5, bandwidth_bps=10e6) for i in (1, 2, 3)],
                       LearnerSpec(t_train=100.0, batch=8, group=4, staleness=3, kappa=1, snapshot_bytes=100e6),
                       NetSpec(b0_bps=1e9, chunk_bytes=10e6, strategy="toy-ladder"),
                       ControlSpec(activation="fixed", fixed_ids=(1, 2, 3), controller=False), steps=3)
    result = simulate(config)
    assert result.t_bcast and all(t == pytest.approx(12.0, rel=1e-6) for t in result.t_all.values())

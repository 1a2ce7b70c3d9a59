"""Chain repair on one child's word (paper section 4.2, appendix D; issue 30): the reporter gets another relay of the
same version, with a fresh credential its new parent is told the fingerprint of, and nobody else moves."""

from __future__ import annotations

import time

import pytest

from dataplane import credentials
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Worker

from .test_broadcast import make_workers, publish, pushes, running_job  # noqa: F401 (pushes: a fixture)
from .test_self_reports import live

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


def report(child: int, parent: int, job, version: int = 1) -> None:
    services.relay_failed(worker=Worker.objects.get(pk=child), job_id=job.pk, version=version,
                          culprit_worker_id=parent, reason="connection refused")


def test_a_childs_word_moves_it_to_another_chains_tail_with_a_fresh_credential(pushes):  # noqa: F811
    workers = make_workers(6)
    job = running_job(workers, b0=2000)  # two chains of three
    live(*workers)
    publish(job, 1)
    (a, b, c), (d, e, f) = telemetry.load_chain_plan(job.pk, 1).chains
    before = {w: len(pushes[w]) for w in (a, d, e)}
    first = pushes[c][-1].credential
    report(c, b, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a, b), (d, e, f, c))
    moved = pushes[c][-1]
    assert moved.parent == Worker.objects.get(pk=f).relay_address and moved.parent_worker_id == f
    assert moved.children == []  # (c keeps no child: it was a tail)
    job.refresh_from_db()
    credentials.verify(job.transfer_secret, moved.credential, job_id=job.pk, version=1, worker_id=c, now=time.time())
    assert credentials.parse(moved.credential)[0].expires >= credentials.parse(first)[0].expires  # issued anew
    assert pushes[f][-1].children == [c]
    assert pushes[f][-1].child_credential_sha256 == {c: credentials.fingerprint(moved.credential)}
    assert pushes[b][-1].children == []  # the accused: its child is gone, its place kept
    assert Worker.objects.get(pk=b).relay_failures == 0
    assert {w: len(pushes[w]) for w in (a, d, e)} == before  # nobody else is told anything


def test_the_orphan_of_a_seed_takes_the_learners_spare_slot_once(pushes):  # noqa: F811
    workers = make_workers(4)
    job = running_job(workers, b0=2000)  # two chains of two: the learner serves two seeds and has one slot more
    live(*workers)
    publish(job, 1)
    (a, b), (c, d) = telemetry.load_chain_plan(job.pk, 1).chains
    Worker.objects.filter(pk=d).update(relay_address="")  # (d cannot serve: it takes no orphan)
    report(b, a, job)
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a,), (c, d), (b,))
    assert pushes[b][-1].parent == job.learner_relay and pushes[b][-1].parent_worker_id is None
    report(d, c, job)  # the learner's slot is taken: the tail a relay (a, still receiving the version) takes it
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((a, d), (c,), (b,))
    assert pushes[d][-1].parent_worker_id == a and pushes[a][-1].children == [d]
    report(d, a, job)  # a second child of a says so: confirmed, a is excised and d takes its seat at the learner
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((d,), (c,), (b,))
    assert pushes[d][-1].parent == job.learner_relay and Worker.objects.get(pk=a).relay_failures == 1

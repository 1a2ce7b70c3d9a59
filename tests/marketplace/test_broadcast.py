"""The site's snapshot broadcast: chain plans per publication, relay-failure repair, install sources."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from dataplane import credentials
from dataplane import messages as m
from dataplane.chat import PromptFormat
from dataplane.snapshot import manifest_reference
from marketplace import services
from marketplace.infra import telemetry
from marketplace.models import Snapshot, SnapshotInstall, Worker
from marketplace.services import base, fanout

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def pushes(monkeypatch):
    """Every message pushed to an agent, per worker id, parsed as its agent parses it (taken before the commit
    these tests never reach). A publication's one event to the job's agents group is expanded as the sockets
    of the workers in its plan expand it (``fanout.Publication.text_for``; tests/marketplace/test_fanout.py
    shows the sockets do)."""
    sent: dict[int, list] = {}

    def capture(group: str, event: dict) -> None:
        if event["type"] == "agent.message":
            sent.setdefault(int(group.removeprefix("worker.")), []).append(m.parse_site_message(event["message"]))
        elif event["type"] == fanout.EVENT:
            publication = fanout.publication_load(event["job_id"], event["version"])
            assert group == fanout.agents_group(event["job_id"]) and publication.nonce == event["nonce"]
            for worker_id in sorted(publication.members):
                text = publication.text_for(worker_id)
                sent.setdefault(worker_id, []).append(m.parse_site_message(json.loads(text)))

    monkeypatch.setattr(base, "_push", capture)
    monkeypatch.setattr(fanout, "_push_event", capture)
    return sent


def publish(job, version: int, **manifest):
    """The learner publishes ``version`` (a well-formed manifest; the site checks it)."""
    return services.snapshot_publish(job=job, version=version, url=f"http://l/v{version}/",
                                     manifest=factories.manifest(job, version, **manifest))


def running_job(workers, *, b0: int, strategy: str = "chain", learner_relay: str = "10.0.0.1:7000"):
    job = factories.job(factories.user(), learner_uplink_bps=b0, broadcast_strategy=strategy)
    services.job_start(job=job)
    for w in workers:
        services.worker_activate(worker=w, job=job)
    job.learner_relay = learner_relay
    job.save(update_fields=["learner_relay"])
    return job


def make_workers(n: int, *, relay: bool = True, bw: int = 1000) -> list[Worker]:
    provider = factories.user()
    out = []
    for i in range(n):
        w, _ = services.worker_register(user=provider, name=f"w{i}", gpu="g", price_per_hour=Decimal("0.1"),
                                        bandwidth_bps=bw, relay_address=f"10.0.1.{i}:7001" if relay else "")
        out.append(w)
    return out


def test_publish_sends_each_worker_its_parent_and_child(pushes):
    workers = make_workers(4)
    job = running_job(workers, b0=2000)  # n_ch = floor(2000 / 1000) = 2 chains of 2
    snap = publish(job, 1)
    assert snap.n_chains == 2
    msgs = {wid: pushes[wid][-1] for wid in (w.pk for w in workers)}
    seeds = [w for w in workers if msgs[w.pk].parent == "10.0.0.1:7000"]
    assert len(seeds) == 2 and all(msgs[s.pk].parent_worker_id is None for s in seeds)
    for seed in seeds:
        (child,) = msgs[seed.pk].children
        assert msgs[child].parent == Worker.objects.get(pk=seed.pk).relay_address
        assert msgs[child].parent_worker_id == seed.pk and msgs[child].children == []
    assert telemetry.load_chain_plan(job.pk, 1) is not None


def test_workers_without_relay_address_are_tails_only(pushes):
    relays, plain = make_workers(1), make_workers(3, relay=False)
    job = running_job([*relays, *plain], b0=1000)  # one chain
    publish(job, 1)
    plan = telemetry.load_chain_plan(job.pk, 1)
    assert plan.chains == ((relays[0].pk, plain[0].pk),)  # the plain worker with the lowest id is the tail
    assert set(plan.rollout_only) == {plain[1].pk, plain[2].pk}
    for w in plain[1:]:
        assert pushes[w.pk][-1].parent is None  # HTTP
    assert all(not pushes[w.pk][-1].children for w in plain)


@pytest.mark.parametrize("strategy,relay", [("star-limited", "10.0.0.1:7000"), ("chain", "")])
def test_star_or_no_learner_relay_means_http_for_everyone(pushes, strategy, relay):
    workers = make_workers(3)
    job = running_job(workers, b0=1000, strategy=strategy, learner_relay=relay)
    publish(job, 1)
    assert all(pushes[w.pk][-1].parent is None and pushes[w.pk][-1].strategy == strategy for w in workers)


def test_relay_failed_repairs_the_chain_and_counts_the_culprit(pushes):
    workers = make_workers(3)
    job = running_job(workers, b0=1000)  # one chain of 3
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    by_id = {w.pk: w for w in workers}
    with pytest.raises(services.ServiceError, match="not your parent"):
        services.relay_failed(worker=by_id[tail], job_id=job.pk, version=1, culprit_worker_id=seed, reason="x")
    services.relay_failed(worker=by_id[tail], job_id=job.pk, version=1, culprit_worker_id=middle, reason="stalled")
    assert telemetry.load_chain_plan(job.pk, 1).chains == ((seed, tail),)
    assert pushes[tail][-1].parent == by_id[seed].relay_address and pushes[tail][-1].parent_worker_id == seed
    assert pushes[seed][-1].children == [tail]
    culprit = Worker.objects.get(pk=middle)
    assert culprit.relay_failures == 1 and culprit.relay_last_failure_at is not None


def test_a_relay_report_that_crossed_the_jobs_end_is_moot_and_one_from_a_stranger_refused(pushes):
    workers = make_workers(3)
    job = running_job(workers, b0=1000)
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    services.job_finish(job=job, status="completed")  # the learner stops its relay: every child sees its parent go
    services.relay_failed(worker=Worker.objects.get(pk=tail), job_id=job.pk, version=1, culprit_worker_id=middle,
                          reason="parent closed")  # no error: the agent is told nothing is wrong
    assert Worker.objects.get(pk=middle).relay_failures == 0  # and nothing is repaired or counted
    stranger = make_workers(1)[0]
    with pytest.raises(services.ServiceError, match="not active in job"):
        services.relay_failed(worker=stranger, job_id=job.pk, version=1, culprit_worker_id=middle, reason="x")


def test_install_via_parent_is_counted_and_credits_the_parent(pushes):
    workers = make_workers(2)
    job = running_job(workers, b0=1000)
    publish(job, 1)
    seed, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    services.snapshot_installed(worker=Worker.objects.get(pk=tail), job_id=job.pk, version=1, seconds=0.1,
                                source="parent")
    services.snapshot_installed(worker=Worker.objects.get(pk=seed), job_id=job.pk, version=1, seconds=0.1,
                                source="parent")
    snap = job.snapshots.get(version=1)
    assert (snap.installs, snap.installs_via_parent) == (2, 2)
    assert Worker.objects.get(pk=seed).relay_successes == 1


def installed_through(job, version: int, *, child, parent, child_s: float, parent_s: float | None) -> None:
    """``parent`` installed ``version`` ``parent_s`` after its publication (None: never reported) and ``child``, its
    chain child, reports its own install now, ``child_s`` after it: as the site sees both (the publication moved
    back in time, the parent's report placed)."""
    snap = Snapshot.objects.get(job=job, version=version)
    Snapshot.objects.filter(pk=snap.pk).update(published_at=timezone.now() - timedelta(seconds=child_s))
    published = Snapshot.objects.get(pk=snap.pk).published_at
    if parent_s is not None:
        services.snapshot_installed(worker=Worker.objects.get(pk=parent), job_id=job.pk, version=version, seconds=0.0,
                                    source="parent")
        SnapshotInstall.objects.filter(snapshot=snap, worker_id=parent).update(
            installed_at=published + timedelta(seconds=parent_s))
    services.snapshot_installed(worker=Worker.objects.get(pk=child), job_id=job.pk, version=version, seconds=0.0,
                                source="parent")


def test_installs_through_a_relay_measure_its_bandwidth_and_the_planner_uses_it(pushes):
    workers = make_workers(2, bw=1000)
    job = running_job(workers, b0=600)  # one chain: seed -> tail
    publish(job, 1, total_bytes=4000)
    seed, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    # the seed had it in 2 s, its child only 8 s after the publication: the seed's uplink was the bottleneck
    installed_through(job, 1, child=tail, parent=seed, child_s=8.0, parent_s=2.0)
    # 4000 B in 8 s (and the ms the site took)
    assert Worker.objects.get(pk=seed).measured_bandwidth_bps == pytest.approx(500.0, rel=0.05)
    assert Worker.objects.get(pk=tail).measured_bandwidth_bps is None  # it relayed nothing
    Worker.objects.filter(pk=tail).update(bandwidth_bps=400)  # (slower than the seed's 500 B/s: the seed stays)
    publish(job, 2, total_bytes=4000)
    assert telemetry.load_chain_plan(job.pk, 2).chains[0] == (seed, tail)
    # the child kept pace with its parent (4 s against 3.8 s): the seed sent at least 1000 B/s, so the figure rises
    installed_through(job, 2, child=tail, parent=seed, child_s=4.0, parent_s=3.8)
    seed_row = Worker.objects.get(pk=seed)
    assert seed_row.measured_bandwidth_bps == pytest.approx(0.7 * 500 + 0.3 * 1000, rel=0.05)  # moving average
    publish(job, 3, total_bytes=4000)
    installed_through(job, 3, child=tail, parent=seed, child_s=0.05, parent_s=0.03)
    seed_row = Worker.objects.get(pk=seed)  # 50 ms measures latency, not bandwidth: counted, not averaged in
    assert seed_row.measured_bandwidth_bps == pytest.approx(0.7 * 500 + 0.3 * 1000, rel=0.05)
    assert seed_row.relay_successes == 3 and seed_row.relay_bandwidth_bps == seed_row.measured_bandwidth_bps

    # n_ch = floor(B0 / median Bw): registered 1000 B/s gives 2 chains of 2 at B0 = 2000; measured at
    # 500 B/s each, the same four workers need four.
    four = make_workers(4, bw=1000)
    job = running_job([], b0=2000)
    for w in four:
        services.worker_activate(worker=w, job=job)
    assert publish(job, 1).n_chains == 2
    Worker.objects.filter(pk__in=[w.pk for w in four]).update(measured_bandwidth_bps=500.0)
    assert publish(job, 2).n_chains == 4


def test_a_relay_starved_by_its_own_parent_keeps_its_bandwidth(pushes):
    """The `harsh` WAN bench: a seed gets B0 / N_ch, half its 50 Mbit/s link, and its child can get no more. Folded
    into the seed's Bw_hat that halved the median, doubled N_ch = floor(B0 / Bw_hat) and made every worker a seed."""
    mbit50 = 6_250_000
    workers = make_workers(4, bw=mbit50)
    job = running_job(workers, b0=2 * mbit50)  # two chains of two
    for version in (1, 2, 3):
        publish(job, version, total_bytes=16_400_000)
        plan = telemetry.load_chain_plan(job.pk, version)
        assert len(plan.chains) == 2, f"v{version}: {plan.chains}"
        for seed, child in plan.chains:  # measured on the bench: seeds at 4.9 s, their children 0.6 s later
            installed_through(job, version, child=child, parent=seed, child_s=5.5, parent_s=4.9)
    assert all(Worker.objects.get(pk=w.pk).relay_bandwidth_bps == mbit50 for w in workers)
    # a report of the child alone, the parent's install unknown to the site: it cannot tell, so it blames nobody
    publish(job, 4, total_bytes=16_400_000)
    seed, child = telemetry.load_chain_plan(job.pk, 4).chains[0]
    installed_through(job, 4, child=child, parent=seed, child_s=5.5, parent_s=None)
    assert Worker.objects.get(pk=seed).relay_bandwidth_bps == mbit50
    assert publish(job, 5, total_bytes=16_400_000).n_chains == 2


def test_a_disconnected_worker_is_left_out_of_the_next_plan(pushes):
    workers = make_workers(3)
    job = running_job(workers, b0=1000)  # one chain of three
    publish(job, 1)
    middle = telemetry.load_chain_plan(job.pk, 1).chains[0][1]
    services.worker_disconnected(worker=Worker.objects.get(pk=middle))  # its activation stays open for a while
    assert job.activations.filter(worker_id=middle, ended_at=None).exists()
    publish(job, 2)
    plan = telemetry.load_chain_plan(job.pk, 2)
    assert middle not in {w for chain in plan.chains for w in chain} | set(plan.rollout_only)
    assert sorted(w for chain in plan.chains for w in chain) == sorted(w.pk for w in workers if w.pk != middle)


@pytest.mark.parametrize("how", ["socket closed", "silent past the timeout"])
def test_a_worker_that_goes_away_is_cut_out_of_the_current_chain_at_once(pushes, settings, how):
    from django.utils import timezone

    workers = make_workers(3)
    job = running_job(workers, b0=1000)  # one chain of three
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    gone = Worker.objects.get(pk=middle)
    if how == "socket closed":
        services.worker_disconnected(worker=gone)
    else:
        Worker.objects.filter(pk=middle).update(
            status=Worker.Status.ACTIVE,
            last_heartbeat=timezone.now() - timezone.timedelta(seconds=settings.ECHO2["WORKER_TIMEOUT_S"] + 5))
        assert services.expire_silent_workers() == 1

    assert telemetry.load_chain_plan(job.pk, 1).chains == ((seed, tail),)
    assert pushes[tail][-1].parent == Worker.objects.get(pk=seed).relay_address  # re-pointed to the seed
    assert pushes[tail][-1].parent_worker_id == seed and pushes[seed][-1].children == [tail]
    assert Worker.objects.get(pk=middle).relay_failures == 0  # going away is not a relay failure


def test_every_snapshot_message_carries_its_workers_credential_and_its_childs_fingerprint(pushes, settings):
    settings.ECHO2 = {**settings.ECHO2, "TRANSFER_CREDENTIAL_TTL_S": 120.0}
    workers = make_workers(3)
    job = running_job(workers, b0=1000)  # one chain of three
    before = time.time()
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    msgs = {w: pushes[w][-1] for w in (seed, middle, tail)}
    for worker_id, msg in msgs.items():
        grant = credentials.verify(job.transfer_secret, msg.credential, job_id=job.pk, version=1, now=time.time(),
                                   worker_id=worker_id)
        assert (grant.lowest, grant.highest) == (1, 1) and before + 119 <= grant.expires <= time.time() + 121
        with pytest.raises(credentials.CredentialError):  # good for this version only
            credentials.verify(job.transfer_secret, msg.credential, job_id=job.pk, version=2, now=time.time())
    assert msgs[seed].child_credential_sha256 == {middle: credentials.fingerprint(msgs[middle].credential)}
    assert msgs[middle].child_credential_sha256 == {tail: credentials.fingerprint(msgs[tail].credential)}
    assert msgs[tail].child_credential_sha256 == {}


def test_a_repair_reissues_the_orphans_credential_and_tells_its_new_parent(pushes):
    workers = make_workers(3)
    job = running_job(workers, b0=1000)
    publish(job, 1)
    seed, middle, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    services.relay_failed(worker=Worker.objects.get(pk=tail), job_id=job.pk, version=1, culprit_worker_id=middle,
                          reason="stalled")
    orphan, new_parent = pushes[tail][-1], pushes[seed][-1]
    assert new_parent.child_credential_sha256 == {tail: credentials.fingerprint(orphan.credential)}
    grant = credentials.verify(job.transfer_secret, orphan.credential, job_id=job.pk, version=1, now=time.time(),
                               worker_id=tail)
    first = next(msg for msg in pushes[tail] if msg.type == "snapshot")
    assert grant.expires >= credentials.parse(first.credential)[0].expires


def test_a_worker_assigned_after_a_publication_gets_a_credential_for_the_newest_snapshot(pushes):
    job = running_job(make_workers(1), b0=1000)
    publish(job, 1)
    late = make_workers(1)[0]
    services.worker_activate(worker=late, job=job)
    assign = next(msg for msg in pushes[late.pk] if msg.type == "assign")
    snapshot = m.SnapshotAvailable.model_validate(assign.snapshot)
    assert credentials.verify(job.transfer_secret, snapshot.credential, job_id=job.pk, version=1, now=time.time(),
                              worker_id=late.pk)


def test_a_published_manifest_must_have_its_shape_and_describe_that_version(pushes):
    job = running_job(make_workers(1), b0=1000)
    bad = factories.manifest(job, 1)
    bad["chunks"][0]["sha256"] = "abc"
    with pytest.raises(services.ServiceError, match=r"^manifest: chunks\.0\.sha256: String should match pattern"):
        services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=bad)
    with pytest.raises(services.ServiceError, match=f"^manifest: describes job {job.pk} version 2, not job "
                                                    f"{job.pk} version 1$"):
        services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=factories.manifest(job, 2))
    assert not job.snapshots.exists()
    good = factories.manifest(job, 1, total_bytes=5000)
    publish(job, 1, total_bytes=5000)
    # What the agents verify against is the manifest as the learner published it (by reference: they fetch it).
    sent = pushes[job.activations.get().worker_id][-1]
    assert (sent.manifest_sha256, sent.manifest_bytes) == manifest_reference(good)


def test_a_delta_is_published_with_its_base_and_full_manifest_and_a_half_described_one_is_refused(pushes):
    from dataplane.snapshot import build_manifest, parse_manifest

    job = running_job(make_workers(1), b0=1000)
    publish(job, 1, total_bytes=5000)
    full = build_manifest(bytes(5000), job_id=job.pk, version=2).model_dump(mode="json")
    delta = build_manifest(bytes(40), job_id=job.pk, version=2).model_dump(mode="json") | {
        "kind": "delta", "base_version": 1, "base_sha256": job.snapshots.get(version=1).manifest["sha256"],
        "encoding": "xor-zstd", "full": full}
    with pytest.raises(services.ServiceError, match="^manifest: a delta needs full$"):
        services.snapshot_publish(job=job, version=2, url="http://l/v2/", manifest=delta | {"full": None})
    services.snapshot_publish(job=job, version=2, url="http://l/v2/", manifest=delta)
    sent = pushes[job.activations.get().worker_id][-1]
    # The delta's manifest, its full one inside, is what the reference names: an agent fetches and checks both.
    assert (sent.manifest_sha256, sent.manifest_bytes) == manifest_reference(parse_manifest(delta))


def base_manifest(job, *, total_bytes: int = 16) -> dict:
    """A well-formed base snapshot manifest (version 0, the checkpoint archive) of ``job``."""
    from dataplane.snapshot import build_manifest

    built = build_manifest(bytes(total_bytes), job_id=job.pk, version=0, format="checkpoint-tar")
    return built.model_dump(mode="json")


def test_the_base_is_published_once_as_version_0_and_assignments_carry_it(pushes):
    workers = make_workers(2)
    job = running_job(workers[:1], b0=1000)
    with pytest.raises(services.ServiceError, match="format 'checkpoint-tar'"):
        services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=factories.manifest(job, 0))
    services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=base_manifest(job))
    job.refresh_from_db()
    assert (job.base_digest, job.published_version) == (base_manifest(job)["sha256"], 0)
    assert pushes[workers[0].pk][-1].version == 0 and pushes[workers[0].pk][-1].parent == "10.0.0.1:7000"
    again = services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=base_manifest(job))
    assert again.version == 0  # the same base announced again (a lost reply) is not an error
    with pytest.raises(services.ServiceError, match="already published"):  # another base is
        services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=base_manifest(job, total_bytes=8))

    services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=factories.manifest(job, 1))
    services.worker_activate(worker=workers[1], job=job)  # a late joiner: base and newest, over HTTP
    late = pushes[workers[1].pk][-1]
    assert isinstance(late, m.Assign) and late.base_digest == base_manifest(job)["sha256"]
    assert (late.base["version"], late.base["url"], late.snapshot["version"]) == (0, "http://l/v0/", 1)


def test_an_agent_asks_for_its_jobs_base_or_newest_snapshot(pushes):
    workers = make_workers(2)
    job = running_job(workers[:1], b0=1000)
    ask = workers[0]
    assert services.snapshot_request(worker=ask, job_id=job.pk, which="base") == []  # nothing published yet
    services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=base_manifest(job))
    services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=factories.manifest(job, 1))
    [base] = services.snapshot_request(worker=ask, job_id=job.pk, which="base")
    [newest] = services.snapshot_request(worker=ask, job_id=job.pk, which="newest")
    assert (base.version, newest.version, newest.parent) == (0, 1, None)  # fetched over HTTP
    with pytest.raises(services.ServiceError, match="not active in job"):
        services.snapshot_request(worker=workers[1], job_id=job.pk, which="newest")


def test_a_request_that_crossed_its_jobs_end_is_told_the_job_ended(pushes):
    """A lease or report that reaches the site just after the job completed names that, not a bare "not active"
    (the demo's agents logged such a lease, sent as the job finished, as a refusal)."""
    workers = make_workers(2)
    job = running_job(workers[:1], b0=1000)
    services.job_finish(job=job, status="completed")
    with pytest.raises(services.ServiceError, match=f"job {job.pk} is completed; this worker was released from it"):
        base.running_activation(workers[0], job.pk)
    with pytest.raises(services.ServiceError, match=f"this worker is not active in job {job.pk}$"):
        base.running_activation(workers[1], job.pk)  # never in it: no word about the job's state


def test_an_install_reported_again_counts_once(pushes):
    workers = make_workers(2)
    job = running_job(workers, b0=1000)  # one chain: seed -> tail
    services.snapshot_publish(job=job, version=1, url="http://l/v1/", manifest=factories.manifest(job, 1))
    seed, tail = telemetry.load_chain_plan(job.pk, 1).chains[0]
    for _ in range(5):
        services.snapshot_installed(worker=Worker.objects.get(pk=tail), job_id=job.pk, version=1, seconds=2.0,
                                    source="parent")
    snap = job.snapshots.get(version=1)
    assert (snap.installs, snap.installs_via_parent, snap.install_reports.count()) == (1, 1, 1)
    assert Worker.objects.get(pk=seed).relay_successes == 1
    services.snapshot_installed(worker=Worker.objects.get(pk=seed), job_id=job.pk, version=1, seconds=2.0)
    assert job.snapshots.get(version=1).installs == 2


def test_the_base_measures_neither_broadcast_time_nor_bandwidth(pushes):
    from marketplace.reads import selectors

    workers = make_workers(2)
    job = running_job(workers, b0=1000)  # one chain: seed -> tail
    services.snapshot_publish(job=job, version=0, url="http://l/v0/", manifest=base_manifest(job, total_bytes=4000))
    seed, tail = telemetry.load_chain_plan(job.pk, 0).chains[0]
    for worker, source in ((seed, "parent"), (tail, "parent")):
        services.snapshot_installed(worker=Worker.objects.get(pk=worker), job_id=job.pk, version=0, seconds=30.0,
                                    source=source)
    assert job.snapshots.get(version=0).t_bcast is not None
    assert selectors.last_broadcast(job) is None  # building an engine is not broadcasting an update
    relay = Worker.objects.get(pk=seed)
    assert relay.relay_successes == 1 and relay.measured_bandwidth_bps is None  # 4000 B in 30 s is no link rate


def test_a_publication_announced_again_is_planned_and_pushed_again_not_refused(pushes):
    """The learner's reply was lost (a restart between commit and reply): it announces the same version
    again, and gets the snapshot back instead of 'not newer than the published'."""
    workers = make_workers(2)
    job = running_job(workers, b0=1000)
    first = publish(job, 1)
    pushed = len(pushes[workers[0].pk])
    again = publish(job, 1)
    assert again.pk == first.pk and Snapshot.objects.filter(job=job, version=1).count() == 1
    assert len(pushes[workers[0].pk]) == pushed + 1  # pushed again: the first push may have been lost too
    with pytest.raises(services.ServiceError, match="not newer"):  # another payload under that version is not
        publish(job, 1, total_bytes=32)


def test_a_restarted_learner_moves_its_snapshots_to_its_new_address(pushes):
    """A restarted learner serves from new ports and announces the site's newest version and the base again from
    there: the newest is pushed again with the new URL (an agent stuck on the dead one gets it), the base only moves,
    and an agent that asks gets the new addresses."""
    workers = make_workers(2)
    job = running_job(workers, b0=1000)
    services.snapshot_publish(job=job, version=0, url="http://old/v0/", manifest=base_manifest(job))
    services.snapshot_publish(job=job, version=2, url="http://old/v2/", manifest=factories.manifest(job, 2))
    pushed = len(pushes[workers[0].pk])

    services.snapshot_publish(job=job, version=0, url="http://new/v0/", manifest=base_manifest(job))
    assert len(pushes[workers[0].pk]) == pushed  # the base is not pushed to agents past it
    services.snapshot_publish(job=job, version=2, url="http://new/v2/", manifest=factories.manifest(job, 2))
    assert [p.url for p in pushes[workers[0].pk][pushed:]] == ["http://new/v2/"]
    ask = workers[1]
    assert [s.url for s in services.snapshot_request(worker=ask, job_id=job.pk, which="base")] == ["http://new/v0/"]
    assert [s.url for s in services.snapshot_request(worker=ask, job_id=job.pk, which="newest")] == ["http://new/v2/"]
    job.refresh_from_db()
    assert job.published_version == 2 and job.snapshots.count() == 2
    with pytest.raises(services.ServiceError, match="not newer"):  # a different payload still may not move in
        services.snapshot_publish(job=job, version=2, url="http://new/v2/",
                                  manifest=factories.manifest(job, 2, total_bytes=32))


def test_the_assignment_carries_the_jobs_prompt_format(pushes):
    job = running_job(make_workers(1), b0=1000)
    job.spec = {**job.spec, "prompt_format": {"chat": True, "system_prompt": "Answer with the number only."}}
    job.save()
    late = make_workers(1)[0]
    services.worker_activate(worker=late, job=job)
    assign = next(msg for msg in pushes[late.pk] if msg.type == "assign")
    assert assign.prompt_format == PromptFormat(chat=True, system_prompt="Answer with the number only.")


@pytest.mark.parametrize("shared_read", [False, True], ids=["alone", "with the socket process's read of the job"])
def test_broadcast_time_is_fixed_by_the_install_that_reaches_the_share_and_moved_by_no_later_one(pushes,
                                                                                                 shared_read):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    workers = make_workers(4)
    job = factories.job(factories.user(), learner_uplink_bps=1000, gamma=2.0)  # T_bcast at ceil(4 / 2) = 2 installs
    services.job_start(job=job)
    for w in workers:
        services.worker_activate(worker=w, job=job)
    publish(job, 1)
    at_work = services.job_at_work(job_id=job.pk) if shared_read else None
    t_bcast, statements = [], []
    for w in workers:
        with CaptureQueriesContext(connection) as queries:
            services.snapshot_installed(worker=w, job_id=job.pk, version=1, seconds=1.0, at_work=at_work)
        t_bcast.append(job.snapshots.get(version=1).t_bcast)
        assert not any("FOR UPDATE" in q["sql"] for q in queries.captured_queries)  # no row held for the fleet
        statements.append(len(queries))
    assert t_bcast[0] is None and t_bcast[1] is not None and t_bcast[2] == t_bcast[3] == t_bcast[1]
    assert job.snapshots.get(version=1).installs == 4 and job.snapshots.get(version=1).install_reports.count() == 4
    # the snapshot, the worker, the install, the counters (and the savepoint and its release: a test runs in a
    # transaction); alone, also the activation and, until T_bcast, the count. It was 12 before it was cut.
    assert statements == ([6] * 4 if shared_read else [8, 8, 7, 7])

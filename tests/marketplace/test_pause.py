"""Pause and resume against a real database and Redis: workers are released and re-activated, the
learner may keep reporting while paused, wrong states get a 400 naming the reason, and the job page's
live payload (workers, versions, chains) follows."""

from __future__ import annotations

import pytest
from asgiref.sync import async_to_sync
from channels.layers import get_channel_layer
from rest_framework.test import APIClient

from marketplace import services
from marketplace.models import Activation, Job, Worker, WorkerCalibration
from marketplace.reads import selectors

from . import factories

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("redis_url")]


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    settings.ECHO2 = {**settings.ECHO2, "REPLAN_INTERVAL_S": 30.0}
    return settings


def online(provider, price: str, *, calibrated: float | None = None, relay: str = "") -> Worker:
    worker, _ = services.worker_register(user=provider, name=f"rig-{price}-{relay or 'x'}", gpu="g",
                                         price_per_hour=price, bandwidth_bps=12_500_000, relay_address=relay)
    Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.IDLE)
    if calibrated is not None:
        WorkerCalibration.objects.create(worker=worker, model_dir=factories.checkpoint_dir(), task_name="arithmetic",
                                         throughput=calibrated)
    worker.refresh_from_db()
    return worker


def client_for(user) -> APIClient:
    client = APIClient()
    client.force_authenticate(user)
    return client


def listen(worker: Worker):
    """A channel in the worker's group, as its agent socket would be; returns a function reading it."""
    layer = get_channel_layer()
    channel = async_to_sync(layer.new_channel)()
    async_to_sync(layer.group_add)(services.worker_group(worker.pk), channel)
    return lambda: async_to_sync(layer.receive)(channel)["message"]


def test_pause_releases_workers_keeps_streams_and_resume_fills_the_pool_at_once(eager):
    owner, provider = factories.user(), factories.user()
    cheap, dear = online(provider, "1.0", calibrated=10.0), online(provider, "9.0", calibrated=10.0)
    job = factories.job(owner, staleness=3, batch_trajectories=64, group_size=8)
    services.job_start(job=job)
    assert set(job.activations.filter(ended_at=None).values_list("worker_id", flat=True)) == {cheap.pk, dear.pk}
    inbox = listen(cheap)

    api = client_for(owner)
    reply = api.post(f"/api/jobs/{job.pk}/pause/")
    assert reply.status_code == 200 and reply.json()["status"] == "paused"
    assert not job.activations.filter(ended_at=None).exists()
    assert set(job.activations.values_list("end_reason", flat=True)) == {"job paused"}
    assert inbox() == {"type": "release", "job_id": job.pk, "reason": "job paused"}
    job.refresh_from_db()
    assert job.status_reason == f"paused by {owner.username}"

    # Paused: no billing, no second pause, but the learner may still report what it trains.
    cost = selectors.job_cost_usd(job)
    assert api.post(f"/api/jobs/{job.pk}/pause/").json()["errors"] == {
        "status": ["job is paused; only a running job can be paused"]}
    services.metrics_record(job=job, step=1, values={"reward_mean": 0.5})
    assert selectors.job_cost_usd(job) == pytest.approx(cost, abs=1e-9)

    # The learner measured T_train meanwhile: mu_min = 2*64/(2*10) = 6.4, target 7.04; the cheap worker
    # covers it alone, and with nobody active the scheduler does not wait out its hysteresis interval.
    Job.objects.filter(pk=job.pk).update(learner_t_train=10.0)
    job.refresh_from_db()
    reply = api.post(f"/api/jobs/{job.pk}/resume/")
    assert reply.status_code == 200 and reply.json()["status"] == "running"
    assert list(job.activations.filter(ended_at=None).values_list("worker_id", flat=True)) == [cheap.pk]
    assert inbox()["type"] == "assign"
    assert api.post(f"/api/jobs/{job.pk}/resume/").status_code == 400


def test_pause_and_resume_need_the_right_state_and_owner(eager):
    owner = factories.user()
    job = factories.job(owner)
    api = client_for(owner)
    assert api.post(f"/api/jobs/{job.pk}/pause/").json()["errors"] == {
        "status": ["job is draft; only a running job can be paused"]}
    assert api.post(f"/api/jobs/{job.pk}/resume/").json()["errors"] == {
        "status": ["job is draft; only a paused or failed job can be resumed"]}
    services.job_start(job=job)
    assert client_for(factories.user()).post(f"/api/jobs/{job.pk}/pause/").status_code == 404
    assert APIClient().post(f"/api/jobs/{job.pk}/pause/").status_code in (401, 403)
    services.job_pause(job=job)
    job.refresh_from_db()
    assert api.post(f"/api/jobs/{job.pk}/cancel/").json()["status"] == "cancelled"  # a paused job can be cancelled
    schema = api.get("/api/schema/").content.decode()
    assert "/api/jobs/{id}/pause/:" in schema and "/api/jobs/{id}/resume/:" in schema  # documented endpoints


def test_live_payload_has_workers_versions_chains_and_the_latest_histogram(eager):
    owner, provider = factories.user(), factories.user()
    relays = [online(provider, f"{i + 1}.0", relay=f"127.0.0.1:{7000 + i}") for i in range(3)]
    job = factories.job(owner, learner_uplink_bps=12_500_000)
    services.job_start(job=job)
    services.learner_announce(job=job, t_train=None, relay_address="127.0.0.1:6999")
    services.metrics_record(job=job, step=1, values={
        "reward_mean": 0.25, "t_train": 0.1, "extra": {"staleness_histogram": {"0": 3, "2": 1}}})
    services.snapshot_publish(job=job, version=1, url="http://x/v1/", manifest=factories.manifest(job, 1))
    services.snapshot_installed(worker=relays[0], job_id=job.pk, version=1, seconds=0.1)

    live = selectors.job_live(Job.objects.get(pk=job.pk))
    assert live["summary"]["step"] == 1 and live["summary"]["published_version"] == 1
    assert [m["staleness_histogram"] for m in live["metrics"]] == [{"0": 3, "2": 1}]
    assert selectors.job_live(Job.objects.get(pk=job.pk), since_step=1)["metrics"] == []
    assert live["snapshots"] == [{"version": 1, "t_bcast": None, "installs": 1, "installs_via_parent": 0}]
    versions = {w["id"]: (w["installed_version"], w["behind"]) for w in live["workers"]}
    assert versions == {relays[0].pk: (1, 0), relays[1].pk: (None, 1), relays[2].pk: (None, 1)}
    broadcast = live["broadcast"]
    assert broadcast["version"] == 1 and broadcast["strategy"] == "chain" and broadcast["learner_relay"]
    # One chain (B0 = Bw), holding all three relays; nobody left to fetch over HTTP.
    assert [sorted(n["id"] for n in chain) for chain in broadcast["chains"]] == [sorted(w.pk for w in relays)]
    assert broadcast["http"] == []

    # Paused: the plan still shows who was in the chain, now released.
    services.job_pause(job=Job.objects.get(pk=job.pk))
    live = selectors.job_live(Job.objects.get(pk=job.pk))
    assert live["workers"] == [] and live["summary"]["status"] == "paused"
    assert {n["active"] for n in live["broadcast"]["chains"][0]} == {False}
    assert Activation.objects.filter(job=job, ended_at=None).count() == 0


def test_live_endpoint_serves_the_page_payload_to_the_owner_only(eager):
    owner = factories.user()
    job = factories.job(owner)
    services.job_start(job=job)
    for step in (1, 2):
        services.metrics_record(job=Job.objects.get(pk=job.pk), step=step, values={"reward_mean": 0.1 * step})
    api = client_for(owner)
    body = api.get(f"/api/jobs/{job.pk}/live/?since=1").json()
    assert [m["step"] for m in body["metrics"]] == [2] and body["summary"]["step"] == 2
    assert set(body) == {"summary", "metrics", "snapshots", "workers", "broadcast"}
    assert api.get(f"/api/jobs/{job.pk}/live/?since=-1").json()["errors"] == {
        "since": ["must be a non-negative integer"]}
    assert client_for(factories.user()).get(f"/api/jobs/{job.pk}/live/").status_code == 404


def test_a_failed_job_keeps_its_streams_and_resumes(eager, redis_client):
    from dataplane import replay

    owner, provider = factories.user(), factories.user()
    worker = online(provider, "1.0")
    job = factories.job(owner)
    api = client_for(owner)
    assert api.post(f"/api/jobs/{job.pk}/start/").status_code == 200
    replay.ReplayBuffer(redis_client, job.pk).add_prompts(["1+1="])
    failed = api.post(f"/api/jobs/{job.pk}/finish/", {"status": "failed", "reason": "Redis gone for 300 s"},
                      format="json")
    assert failed.status_code == 200 and failed.json()["status"] == "failed"
    assert not Activation.objects.filter(job=job, ended_at=None).exists()  # billing stopped
    assert redis_client.xlen(replay.prompts_key(job.pk)) == 1  # kept for the resume

    resumed = api.post(f"/api/jobs/{job.pk}/resume/")
    assert resumed.status_code == 200, resumed.content
    job.refresh_from_db()
    assert (job.status, job.status_reason, job.finished_at) == ("running", "", None)
    assert Activation.objects.filter(job=job, worker=worker, ended_at=None).exists()  # a pool at once

    api.post(f"/api/jobs/{job.pk}/finish/", {"status": "failed", "reason": "again"}, format="json")
    cancelled = api.post(f"/api/jobs/{job.pk}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["status"] == "cancelled"
    assert redis_client.exists(replay.prompts_key(job.pk)) == 0  # a cancelled job's streams go
    again = api.post(f"/api/jobs/{job.pk}/resume/")
    assert again.status_code == 400 and "only a paused or failed job" in str(again.json())


def test_a_job_whose_learner_is_silent_stalls_and_runs_again_when_it_returns(eager):
    from django.utils import timezone

    from marketplace import tasks

    eager.ECHO2 = {**eager.ECHO2, "LEARNER_TIMEOUT_S": 60.0}
    owner, provider = factories.user(), factories.user()
    worker = online(provider, "1.0")
    job = factories.job(owner)
    api = client_for(owner)
    assert api.post(f"/api/jobs/{job.pk}/start/").status_code == 200
    assert Activation.objects.filter(job=job, ended_at=None).count() == 1
    api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0}, format="json")
    assert tasks.stall_silent_learners() == 0  # heard from just now

    Job.objects.filter(pk=job.pk).update(learner_seen_at=timezone.now() - timezone.timedelta(seconds=61))
    assert tasks.stall_silent_learners() == 1
    job.refresh_from_db()
    assert job.status == "stalled" and "learner has been silent since" in job.status_reason
    assert not Activation.objects.filter(job=job, ended_at=None).exists()  # nobody billed for it
    assert api.get(f"/api/jobs/{job.pk}/").json()["status"] == "stalled"

    beat = api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": None}, format="json")  # the learner's heartbeat
    assert beat.status_code == 200, beat.content
    job.refresh_from_db()
    assert (job.status, job.status_reason) == ("running", "")
    assert Activation.objects.filter(job=job, worker=worker, ended_at=None).exists()  # a pool again at once


def test_a_job_whose_learner_never_started_stalls(eager):
    from django.utils import timezone

    from marketplace import tasks

    eager.ECHO2 = {**eager.ECHO2, "LEARNER_TIMEOUT_S": 60.0}
    owner = factories.user()
    job = factories.job(owner)
    services.job_start(job=job)
    assert tasks.stall_silent_learners() == 0
    Job.objects.filter(pk=job.pk).update(started_at=timezone.now() - timezone.timedelta(seconds=61))
    assert tasks.stall_silent_learners() == 1
    assert Job.objects.get(pk=job.pk).status == "stalled"

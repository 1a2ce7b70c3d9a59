"""REST API: registration, job control, permissions, and clear 4xx errors for bad input."""

from __future__ import annotations

from pathlib import Path

import pytest
from rest_framework.test import APIClient

from marketplace.models import Job, Worker

from . import factories

pytestmark = pytest.mark.django_db


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


def test_register_worker_returns_key_once_and_lists_only_own():
    alice, bob = factories.user("alice"), factories.user("bob")
    reply = client_for(alice).post("/api/workers/", {"name": "rig", "price_per_hour": "0.35",
                                                     "bandwidth_bps": 1000}, format="json")
    assert reply.status_code == 201, reply.content
    assert reply.json()["agent_key"].startswith("e2w_")
    factories.worker(bob)
    mine = client_for(alice).get("/api/workers/").json()["results"]
    assert [w["name"] for w in mine] == ["rig"]
    assert "agent_key" not in mine[0]
    assert Worker.objects.get(name="rig").key_hash != reply.json()["agent_key"]  # only the hash is stored


@pytest.mark.parametrize(("body", "field"), [
    ({"name": "rig", "price_per_hour": "-1", "bandwidth_bps": 1000}, "price_per_hour"),
    ({"name": "rig", "price_per_hour": "0.3", "bandwidth_bps": 0}, "bandwidth_bps"),
    ({"price_per_hour": "0.3", "bandwidth_bps": 10}, "name"),
])
def test_register_worker_bad_input_names_the_field(body, field):
    reply = client_for(factories.user()).post("/api/workers/", body, format="json")
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith(f"{field}:")


def test_duplicate_worker_name_is_a_400():
    owner = factories.user()
    api = client_for(owner)
    body = {"name": "rig", "price_per_hour": "0.3", "bandwidth_bps": 10}
    assert api.post("/api/workers/", body, format="json").status_code == 201
    reply = api.post("/api/workers/", body, format="json")
    assert reply.status_code == 400 and "already have a worker named" in reply.json()["detail"]


def test_create_job_applies_defaults():
    reply = client_for(factories.user()).post("/api/jobs/", {"name": "j", "model_dir": factories.checkpoint_dir(),
                                                             "task": {"name": "arithmetic"}}, format="json")
    assert reply.status_code == 201, reply.content
    job = reply.json()
    assert (job["staleness"], job["kappa"], job["status"]) == (3, 2, "draft")


@pytest.mark.parametrize(("extra", "field"), [
    ({"staleness": 1}, "staleness"),
    ({"staleness": 3, "kappa": 3}, "kappa"),
    ({"task": {"name": "no-such-task"}}, "task"),
    ({"batch_trajectories": 10, "group_size": 4}, "batch_trajectories"),
    ({"learning_rate": -0.1}, "learning_rate"),
    ({"model_dir": "meta-llama/Llama-3-8B"}, "model_dir"),  # a hub id: the learner would have to download it
    ({"model_dir": "/no/such/checkpoint"}, "model_dir"),
])
def test_create_job_bad_input_names_the_field(extra, field):
    body = {"name": "j", "model_dir": factories.checkpoint_dir(), "task": {"name": "arithmetic"}, **extra}
    reply = client_for(factories.user()).post("/api/jobs/", body, format="json")
    assert reply.status_code == 400, reply.content
    assert reply.json()["detail"].startswith(f"{field}:")
    assert Job.objects.count() == 0


def test_jobs_are_private_to_their_owner_and_staff(redis_url):
    owner, other, staff = factories.user(), factories.user(), factories.user(is_staff=True)
    job = factories.job(owner)
    assert client_for(other).get(f"/api/jobs/{job.pk}/").status_code == 404
    assert client_for(other).post(f"/api/jobs/{job.pk}/start/").status_code == 404
    assert client_for(staff).get(f"/api/jobs/{job.pk}/").status_code == 200
    assert client_for(owner).get("/api/jobs/").json()["count"] == 1
    assert client_for(other).get("/api/jobs/").json()["count"] == 0


def test_unknown_job_is_404_and_bad_token_is_401():
    api = client_for(factories.user())
    assert api.get("/api/jobs/999/").status_code == 404
    anon = APIClient()
    anon.credentials(HTTP_AUTHORIZATION="Token not-a-token")
    reply = anon.get("/api/jobs/")
    assert reply.status_code == 401 and "token" in reply.json()["detail"].lower()


def test_start_and_cancel_follow_the_status_machine(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    assert api.post(f"/api/jobs/{job.pk}/start/").json()["status"] == "running"
    again = api.post(f"/api/jobs/{job.pk}/start/")
    assert again.status_code == 400 and "only a draft job can be started" in again.json()["detail"]
    assert api.post(f"/api/jobs/{job.pk}/cancel/").json()["status"] == "cancelled"
    assert api.post(f"/api/jobs/{job.pk}/cancel/").status_code == 400


def test_learner_reports_are_refused_once_the_job_ended(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    assert api.post(f"/api/jobs/{job.pk}/metrics/", {"step": 1, "reward_mean": 0.5}, format="json").status_code == 201
    assert api.get(f"/api/jobs/{job.pk}/metrics/").json()[0]["reward_mean"] == 0.5
    api.post(f"/api/jobs/{job.pk}/cancel/")
    late = api.post(f"/api/jobs/{job.pk}/metrics/", {"step": 2, "reward_mean": 0.6}, format="json")
    assert late.status_code == 400 and "cancelled" in late.json()["detail"]
    bad = api.get(f"/api/jobs/{job.pk}/metrics/?since=abc")
    assert bad.status_code == 400 and bad.json()["detail"].startswith("since:")


def test_openapi_schema_is_served():
    reply = client_for(factories.user()).get("/api/schema/")
    assert reply.status_code == 200
    assert b"/api/jobs/{id}/start/" in reply.content


def test_agent_reports_its_calibration_with_its_key_and_only_its_own():
    provider = factories.user()
    worker, key = factories.worker(provider)
    other, _ = factories.worker(provider)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    body = {"model_dir": "/models/tiny", "task": {"name": "arithmetic"}, "throughput": 12.5}
    reply = agent.post(f"/api/workers/{worker.pk}/calibrations/", body, format="json")
    assert reply.status_code == 201, reply.content
    assert reply.json()["task_name"] == "arithmetic"
    worker.refresh_from_db()
    assert worker.throughput is None  # a claim, not a measurement: the scheduler uses it only for this model
    assert agent.post(f"/api/workers/{other.pk}/calibrations/", body, format="json").status_code == 403
    bad = agent.post(f"/api/workers/{worker.pk}/calibrations/", {**body, "throughput": 0}, format="json")
    assert bad.status_code == 400 and bad.json()["detail"].startswith("throughput:")
    for lie in (1e300, 2e6):  # a calibration of 10^300 traj/s would make the machine look free
        huge = agent.post(f"/api/workers/{worker.pk}/calibrations/", {**body, "throughput": lie}, format="json")
        assert huge.status_code == 400 and huge.json()["detail"].startswith("throughput:")
    for raw in ('"throughput": Infinity', '"throughput": NaN'):
        text = '{"model_dir": "/models/tiny", "task": {"name": "arithmetic"}, ' + raw + "}"
        refused = agent.post(f"/api/workers/{worker.pk}/calibrations/", text, content_type="application/json")
        assert refused.status_code == 400
    assert [c.throughput for c in worker.calibrations.all()] == [12.5]
    unknown = agent.post(f"/api/workers/{worker.pk}/calibrations/", {**body, "task": {"name": "zzz"}}, format="json")
    assert unknown.status_code == 400 and "unknown task 'zzz'" in unknown.json()["detail"]
    stranger = APIClient()
    stranger.credentials(HTTP_AUTHORIZATION="Bearer e2w_nope")
    assert stranger.post(f"/api/workers/{worker.pk}/calibrations/", body, format="json").status_code == 401


def test_learner_extra_metrics_are_stored_flat(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    api.post(f"/api/jobs/{job.pk}/metrics/", {"step": 1, "reward_mean": 0.5, "extra": {"kl": 0.01}}, format="json")
    assert api.get(f"/api/jobs/{job.pk}/metrics/").json()[0]["extra"] == {"kl": 0.01}


@pytest.mark.parametrize("extra", [{"kl": 1e308}, {"timing": {"train": -1e300}}, {"eval": [[[[[[[[1]]]]]]]]},
                                   {"storage": "x" * 5000}])
def test_learner_extra_metrics_out_of_bounds_are_a_400(redis_url, settings, extra):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    reply = api.post(f"/api/jobs/{job.pk}/metrics/", {"step": 1, "reward_mean": 0.5, "extra": extra}, format="json")
    assert reply.status_code == 400 and reply.json()["detail"].startswith("extra:"), reply.content
    assert api.get(f"/api/jobs/{job.pk}/metrics/").json() == []


def test_the_transfer_secret_reaches_only_the_learner_in_the_reply_to_its_announcement(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner, provider = factories.user(), factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    other = factories.job(owner)
    secret = Job.objects.get(pk=job.pk).transfer_secret
    assert len(secret) >= 40 and secret != Job.objects.get(pk=other.pk).transfer_secret  # one per job
    api.post(f"/api/jobs/{job.pk}/start/")

    announced = api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.5, "relay_address": "127.0.0.1:7000"},
                         format="json")
    assert announced.status_code == 200 and announced.json()["transfer_secret"] == secret
    for path in ("/api/jobs/", f"/api/jobs/{job.pk}/", f"/api/jobs/{job.pk}/summary/", f"/api/jobs/{job.pk}/live/",
                 f"/api/jobs/{job.pk}/snapshots/", f"/api/jobs/{job.pk}/plan/", "/api/schema/"):
        reply = api.get(path)
        assert reply.status_code == 200 and secret.encode() not in reply.content, path
    api.force_login(owner)
    page = api.get(f"/jobs/{job.pk}/")
    assert page.status_code == 200 and secret.encode() not in page.content

    _, key = factories.worker(provider)
    agent = APIClient()
    agent.credentials(HTTP_AUTHORIZATION=f"Bearer {key}")
    refused = agent.post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0}, format="json")
    assert refused.status_code == 403 and secret.encode() not in refused.content
    stranger = client_for(provider).post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0}, format="json")
    assert stranger.status_code == 404
    staff = client_for(factories.user(is_staff=True)).post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0},
                                                             format="json")
    assert staff.status_code == 403 and secret.encode() not in staff.content, "staff may not export it: no secret"
    assert "only the job's owner announces its learner" in staff.json()["detail"]


def test_a_malformed_manifest_is_a_400_naming_the_field(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    manifest = factories.manifest(job, 1)
    manifest["total_bytes"] = 10**9
    url = "http://127.0.0.1:8001/v1/"
    reply = api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": url, "manifest": manifest}, format="json")
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith("manifest: 1 chunks, but 1000000000 bytes in chunks of")
    good = api.post(f"/api/jobs/{job.pk}/snapshots/", {"version": 1, "url": url,
                                                      "manifest": factories.manifest(job, 1)}, format="json")
    assert good.status_code == 201 and good.json()["manifest"]["sha256"] == factories.manifest(job, 1)["sha256"]


def test_the_secret_migration_gives_every_existing_job_its_own(settings):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("marketplace.migrations.0009_job_transfer_secret")
    owner = factories.user()
    jobs = [factories.job(owner) for _ in range(3)]
    Job.objects.filter(pk__in=[j.pk for j in jobs]).update(transfer_secret="")  # rows from before the field
    migration.fill_secrets(apps, None)
    secrets = set(Job.objects.values_list("transfer_secret", flat=True))
    assert len(secrets) == 3 and all(len(s) >= 40 for s in secrets)


def test_summary_max_staleness_is_the_runs_not_the_last_steps(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    for step, lag in ((1, 0), (2, 3), (3, 2)):
        api.post(f"/api/jobs/{job.pk}/metrics/", {"step": step, "reward_mean": 0.5, "max_staleness": lag},
                 format="json")
    summary = api.get(f"/api/jobs/{job.pk}/summary/").json()
    assert summary["max_staleness"] == 3  # the run trained on a lag of 3, though its last step's was 2


def test_a_job_whose_model_dir_vanished_is_not_started(redis_url, tmp_path):
    owner = factories.user()
    job = factories.job(owner, model_dir=factories.checkpoint_dir(f"vanishing-{tmp_path.name}"))
    (Path(job.model_dir) / "config.json").unlink()
    Path(job.model_dir).rmdir()
    reply = client_for(owner).post(f"/api/jobs/{job.pk}/start/")
    assert reply.status_code == 400
    assert reply.json()["detail"].startswith(f"model_dir: no directory {job.model_dir}")
    assert Job.objects.get(pk=job.pk).status == "draft"


def test_a_learner_without_a_relay_announces_an_empty_address(redis_url, settings):
    # A star-strategy job runs no relay hub: the learner announces "" (it was refused as blank, so such a job
    # could never start its learner).
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner, broadcast_strategy="star-limited")
    api.post(f"/api/jobs/{job.pk}/start/")
    reply = api.post(f"/api/jobs/{job.pk}/learner/", {"t_train": 1.0, "relay_address": ""}, format="json")
    assert reply.status_code == 200, reply.content
    assert Job.objects.get(pk=job.pk).learner_relay == ""

"""Issue 29: hardware facts stored as the agent reports them, jobs' requirements matched against them (a worker with
too little memory is never activated, and the plan preview says why), a waiting job's reason, and the reliability
figure with its parts on the API."""

from __future__ import annotations

import json
import time
from datetime import timedelta

import pytest
from django.utils import timezone
from rest_framework.test import APIClient

from dataplane.hardware import Hardware
from echo2_cli.render import summary_rows
from marketplace import services
from marketplace.models import Activation, Worker, WorkerCalibration
from marketplace.reads import matching, scheduling, selectors

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

MODEL = factories.checkpoint_dir()


def gpu(memory_gb: float, engines=("hf", "vllm")) -> Hardware:
    return Hardware(gpus=[{"name": f"GPU {memory_gb:g} GB", "memory_gb": memory_gb, "capability": "8.0"}],
                    engines=list(engines), cpu_count=8, ram_gb=64, disk_free_gb=500)


def online(provider, hardware: Hardware | None, *, price="1.0", calibrated=5.0, model_dir=MODEL) -> Worker:
    """An idle worker whose agent said hello with ``hardware``, calibrated on the arithmetic task."""
    worker, _ = factories.worker(provider, price=price)
    services.worker_connected(worker=worker, installed_version=None, hardware=hardware)
    WorkerCalibration.objects.create(worker=worker, model_dir=model_dir, task_name="arithmetic", throughput=calibrated)
    worker.refresh_from_db()
    return worker


@pytest.fixture
def eager(settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True  # job_start plans the pool at once (task replan_job)
    return settings


def client_for(user) -> APIClient:
    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(user)}")
    return api


def big_model(tmp_path) -> str:
    """An 8B-shaped checkpoint (sparse weights file): about 20 GB estimated for hf in bf16."""
    (tmp_path / "config.json").write_text(json.dumps({
        "hidden_size": 4096, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 8,
        "max_position_embeddings": 8192, "torch_dtype": "bfloat16", "vocab_size": 128256}))
    with open(tmp_path / "model.safetensors", "wb") as f:
        f.truncate(16 * 10**9)
    return str(tmp_path)


def test_registration_and_hello_store_the_hardware_and_bad_hardware_is_a_400():
    provider = factories.user()
    api = client_for(provider)
    body = {"name": "rig", "price_per_hour": "1.0", "bandwidth_bps": 1000, "hardware": gpu(24).model_dump()}
    reply = api.post("/api/workers/", body, format="json")
    assert reply.status_code == 201, reply.content
    assert reply.json()["hardware"]["gpus"][0]["memory_gb"] == 24.0 and reply.json()["hardware_at"]
    worker = Worker.objects.get(pk=reply.json()["id"])
    services.worker_connected(worker=worker, installed_version=None, hardware=gpu(80))
    services.worker_connected(worker=worker, installed_version=None)  # an older agent's hello keeps the facts
    worker.refresh_from_db()
    assert worker.facts.gpu_memory_gb == 80.0
    bad = {**body, "name": "rig2", "hardware": {**gpu(24).model_dump(), "ram_gb": -1}}
    reply = api.post("/api/workers/", bad, format="json")
    assert reply.status_code == 400 and "hardware.ram_gb" in json.dumps(reply.json())


def test_a_worker_with_too_little_memory_is_never_activated_and_the_preview_says_why(
        eager, django_capture_on_commit_callbacks):
    provider, owner = factories.user(), factories.user()
    small = online(provider, gpu(24), price="0.5")
    big = online(provider, gpu(80), price="2.0")
    unknown = online(provider, None, price="0.1")  # an older agent: no facts
    body = {"name": "needs 40 GB", "model_dir": MODEL, "task": {"name": "arithmetic"}, "batch_trajectories": 8,
            "group_size": 4, "requirements": {"min_gpu_memory_gb": 40}}
    reply = client_for(owner).post("/api/jobs/plan/", {**body, "t_train_s": 10}, format="json")
    assert reply.status_code == 200, reply.content
    req = reply.json()["requirements"]
    assert (req["qualify"], req["total"], req["excluded"]) == (1, 3, {"memory": 1, "hardware unknown": 1})
    assert req["line"] == "1 of 3 match (memory 1, hardware unknown 1)" and req["memory"] == "given"
    assert [w["id"] for w in reply.json()["plan"]["workers"]] == [big.pk]
    job = factories.job(owner, requirements={"min_gpu_memory_gb": 40})
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)  # calibration phase: every idle worker that qualifies
    assert list(job.activations.values_list("worker_id", flat=True)) == [big.pk]
    job.learner_t_train = 1.0
    job.save()
    scheduling.job_replan(job, now=time.time())
    pool = scheduling.job_pool(job)
    assert small.pk not in pool.workers and unknown.pk not in pool.workers
    assert scheduling.job_plan(job)["requirements"]["excluded"] == {"memory": 1, "hardware unknown": 1}
    assert not Activation.objects.filter(worker__in=[small, unknown]).exists()


def test_the_memory_is_estimated_from_the_model_when_not_given(tmp_path):
    provider = factories.user()
    model = big_model(tmp_path)
    online(provider, gpu(16), model_dir=model)
    online(provider, gpu(48), model_dir=model)
    plan = scheduling.spec_plan(factories.parse_job_spec({"name": "8B", "model_dir": model,
                                                          "task": {"name": "arithmetic"}}), user=provider)
    req = plan["requirements"]
    assert req["memory"].startswith("estimated: 8B parameters") and 20 < req["min_gpu_memory_gb"] < 48
    assert (req["qualify"], req["excluded"]) == (1, {"memory": 1})


def test_a_waiting_job_says_why_in_the_summary_the_api_and_the_cli(eager, django_capture_on_commit_callbacks):
    provider, owner = factories.user(), factories.user()
    online(provider, gpu(24))
    job = factories.job(owner, requirements={"min_gpu_memory_gb": 40})
    with django_capture_on_commit_callbacks(execute=True):
        services.job_start(job=job)
    assert selectors.job_summary(job)["waiting_reason"].startswith("waiting for learner")
    job.learner_seen_at = timezone.now()
    job.save(update_fields=["learner_seen_at"])
    reason = ("waiting for workers: 0 of 1 match (memory 1): needs 40 GB of GPU memory; the largest worker has 24 GB: "
              "lower requirements.min_gpu_memory_gb or wait")
    summary = client_for(owner).get(f"/api/jobs/{job.pk}/summary/").json()
    assert summary["waiting_reason"] == reason
    assert ("waiting", reason) in summary_rows(summary)
    big = online(provider, gpu(80))
    assert matching.job_waiting_reason(job) == "waiting for workers: 1 of 2 match (memory 1); the next re-plan " \
                                               "activates them"
    with django_capture_on_commit_callbacks(execute=True):
        services.job_activate_idle_workers(job=job)  # what the next re-plan does in the calibration phase
    assert list(job.activations.values_list("worker_id", flat=True)) == [big.pk]
    assert selectors.job_summary(job)["waiting_reason"] == ""


def test_reliability_shows_its_parts_and_a_silent_release_lowers_it():
    provider = factories.user()
    worker = online(provider, gpu(24))
    shown = client_for(provider).get(f"/api/workers/{worker.pk}/").json()["reliability"]
    assert shown["value"] == 1.0 and set(shown["parts"]) == {"stay", "audits", "relays", "delivery"}
    job = factories.job(factories.user())
    now = timezone.now()
    Activation.objects.create(job=job, worker=worker, price_per_hour=1, started_at=now - timedelta(minutes=5),
                              ended_at=now, end_reason="silent: no group accepted for 180 s",
                              end_code=Activation.End.SILENT)
    Worker.objects.filter(pk=worker.pk).update(audits_failed=1)
    worker.refresh_from_db()
    r = matching.worker_reliability([worker])[worker.pk]
    assert (r.delivery, r.audits) == (pytest.approx(2 / 3), pytest.approx(2 / 3))
    assert r.value == pytest.approx(r.stay * 4 / 9)
    [candidate] = [c for c in scheduling.job_pool(factories.job(factories.user())).standby if c.worker_id == worker.pk]
    assert candidate.reliability == pytest.approx(r.value)  # what activation weighs a_i mu_i by

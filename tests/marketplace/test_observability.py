"""/healthz, /readyz and /metrics (Prometheus): what an operator's probes and scraper read."""

from __future__ import annotations

import pytest
from django.test import Client

from marketplace.infra import probes
from marketplace.models import Job

from . import factories

pytestmark = pytest.mark.django_db


def test_healthz_answers_without_touching_anything() -> None:
    response = Client().get("/healthz")
    assert response.status_code == 200 and response.json() == {"status": "ok"}


def test_readyz_needs_a_recent_celery_beat(redis_url) -> None:
    response = Client().get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"] == {"database": "ok", "redis": "ok", "celery": "down: no beat task has run yet"}
    probes.celery_alive()  # what replan_running_jobs does on every beat
    response = Client().get("/readyz")
    assert response.status_code == 200 and response.json()["checks"]["celery"].startswith("ok (beat ran")


def test_readyz_says_which_dependency_is_down_but_not_where_it_is(settings, tmp_path, caplog) -> None:
    from marketplace.infra import stream
    from tests.private_redis import PrivateRedis

    settings.REDIS_URL = PrivateRedis(tmp_path).url  # nothing listens there
    stream.client.cache_clear()
    try:
        response = Client().get("/readyz")
    finally:
        stream.client.cache_clear()
    assert response.status_code == 503
    checks = response.json()["checks"]
    assert checks["database"] == "ok" and checks["redis"].startswith("down") and checks["celery"].startswith("unknown")
    where = settings.REDIS_URL.rsplit(":", 1)[-1].split("/")[0]  # the port (or the socket path) of the address
    assert where not in response.content.decode(), "a public probe names no address (issue 26)"
    assert any("Redis is down" in r.getMessage() and where in r.getMessage() for r in caplog.records), (
        "the operator's log keeps the detail")


def test_metrics_need_the_token_or_a_staff_session(settings, redis_url) -> None:
    settings.ECHO2 = {**settings.ECHO2, "METRICS_TOKEN": "s3cret"}
    assert Client().get("/metrics").status_code == 403
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer wrong").status_code == 403
    owner = factories.user()
    client = Client()
    client.force_login(owner)
    assert client.get("/metrics").status_code == 403  # a job owner sees only their own jobs, elsewhere
    assert Client().get("/metrics", HTTP_AUTHORIZATION="Bearer s3cret").status_code == 200


def test_metrics_show_jobs_by_status_and_a_running_jobs_figures(settings, redis_url) -> None:
    settings.ECHO2 = {**settings.ECHO2, "METRICS_TOKEN": "t"}
    owner = factories.user()
    factories.job(owner)
    running = factories.job(owner)
    Job.objects.filter(pk=running.pk).update(status=Job.Status.RUNNING, learner_step=7, published_version=6)
    body = Client().get("/metrics", HTTP_AUTHORIZATION="Bearer t").content.decode()
    assert 'echo2_jobs{status="running"} 1.0' in body and 'echo2_jobs{status="draft"} 1.0' in body
    assert f'echo2_job_step{{job="{running.pk}"}} 7.0' in body
    assert f'echo2_job_published_version{{job="{running.pk}"}} 6.0' in body
    assert f'echo2_job_accepted_records_total{{job="{running.pk}"}} 0.0' in body

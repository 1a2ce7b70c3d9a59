"""Samples on the site: a step report's rows are validated field by field, stored, the job's newest
SAMPLES_KEPT_PER_JOB kept, and served newest first within a reward range, to the job's owner only."""

from __future__ import annotations

import pytest

from dataplane import samples
from marketplace.models import JobSample

from . import factories
from .test_api import client_for

pytestmark = pytest.mark.django_db


def row(step: int, reward: float, **change) -> dict:
    return {"step": step, "version": step - 1, "worker": 3, "reward": reward, "prompt": f"q{step}",
            "completion": f"a{step} r={reward}", **change}


@pytest.fixture
def running(redis_url, settings):
    settings.CELERY_TASK_ALWAYS_EAGER = True
    owner = factories.user()
    api = client_for(owner)
    job = factories.job(owner)
    api.post(f"/api/jobs/{job.pk}/start/")
    return api, job


def report(api, job, step: int, rows: list[dict]):
    return api.post(f"/api/jobs/{job.pk}/metrics/", {"step": step, "reward_mean": 0.5, "samples": rows},
                    format="json")


def test_samples_come_back_newest_first_within_a_reward_range(running) -> None:
    api, job = running
    assert report(api, job, 10, [row(10, 0.0), row(10, 1.0)]).status_code == 201
    assert report(api, job, 20, [row(20, 0.5), row(20, 1.0)]).status_code == 201
    assert report(api, job, 21, []).status_code == 201  # a step without samples

    got = api.get(f"/api/jobs/{job.pk}/samples/").json()
    assert [(r["step"], r["reward"]) for r in got] == [(20, 0.5), (20, 1.0), (10, 0.0), (10, 1.0)]
    assert got[0] | {"created_at": None} == {**row(20, 0.5), "created_at": None}
    high = api.get(f"/api/jobs/{job.pk}/samples/?min_reward=0.75").json()
    assert [(r["step"], r["reward"]) for r in high] == [(20, 1.0), (10, 1.0)]
    low = api.get(f"/api/jobs/{job.pk}/samples/?max_reward=0.5&limit=1").json()
    assert [(r["step"], r["reward"]) for r in low] == [(20, 0.5)]
    assert report(api, job, 20, [row(20, 0.25)]).status_code == 201  # the step's report sent again: its rows replaced
    assert [r["reward"] for r in api.get(f"/api/jobs/{job.pk}/samples/?min_reward=0&max_reward=0.3").json()] == [
        0.25, 0.0]

    stranger = client_for(factories.user("mallory"))
    assert stranger.get(f"/api/jobs/{job.pk}/samples/").status_code == 404


def test_only_the_newest_are_kept(running, monkeypatch) -> None:
    api, job = running
    monkeypatch.setattr("marketplace.services.samples.SAMPLES_KEPT_PER_JOB", 5)
    for step in range(1, 5):
        assert report(api, job, step, [row(step, 0.0), row(step, 1.0)]).status_code == 201
    assert list(JobSample.objects.filter(job=job).values_list("step", flat=True).order_by("step", "id")) == [
        2, 3, 3, 4, 4]


@pytest.mark.parametrize(("rows", "field"), [
    ([row(1, 0.0, prompt="x" * (samples.PROMPT_CHARS + 1))], "samples.0.prompt"),
    ([row(1, 0.0), row(1, 0.0, completion="a\x00b")], "samples.1.completion: NUL"),
    ([{**row(1, 0.0), "reward": "high"}], "samples.0.reward"),
    ([row(1, 0.0)] * (samples.MAX_SAMPLES_PER_REPORT + 1), "samples"),
])
def test_bad_rows_are_refused_naming_the_field(running, rows, field) -> None:
    api, job = running
    reply = report(api, job, 1, rows)
    assert reply.status_code == 400 and reply.json()["detail"].startswith(field), reply.json()
    assert not JobSample.objects.filter(job=job).exists()


def test_a_bad_query_is_refused_naming_the_parameter(running) -> None:
    api, job = running
    for query, field in (("min_reward=abc", "min_reward"), ("min_reward=1&max_reward=0", "min_reward"),
                         ("limit=0", "limit")):
        reply = api.get(f"/api/jobs/{job.pk}/samples/?{query}")
        assert reply.status_code == 400 and reply.json()["detail"].startswith(field), (query, reply.json())

"""Migration 0026 gives jobs and activations saved before it the reason codes the site now decides by, read once
from their reasons' words: a job paused at its budget still runs again when its budget is raised, a worker that
refused a job is still never planned for it, a silent release still counts against the worker."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from django.utils import timezone

BEFORE = [("marketplace", "0025_job_learner_redis_password")]


def _migrate(target):
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_rows_saved_before_the_codes_get_them_from_their_words() -> None:
    old = _migrate(BEFORE)
    owner = old.get_model("auth", "User").objects.create(username="owner")
    provider = old.get_model("marketplace", "Provider").objects.create(user=owner)
    OldJob, OldActivation = old.get_model("marketplace", "Job"), old.get_model("marketplace", "Activation")
    worker = old.get_model("marketplace", "Worker").objects.create(provider=provider, name="rig", gpu="A10",
                                                                   price_per_hour=1, bandwidth_bps=10**8)

    def job(status, reason):
        return OldJob.objects.create(owner=owner, name="j", model_dir="/m", task={"name": "arithmetic"},
                                     status=status, status_reason=reason).pk

    jobs = {"over_budget": job("paused", "over budget: spent $0.03 of $0.02"),
            "by_person": job("paused", "paused by ann"), "learner": job("paused", "paused by the learner: no data"),
            "": job("failed", "learner crashed"),
            "learner_silent": job("stalled", "the learner has been silent since 2026-12-01 10:00:00 UTC")}
    ends = {reason: OldActivation.objects.create(job_id=jobs[""], worker=worker, price_per_hour=1,
                                                 ended_at=timezone.now(), end_reason=reason).pk
            for reason in ("silent: no group accepted for 180 s", "refuses the job: reward: runs user code",
                           "worker disconnected", "capacity above target: 3 > 2")}
    try:
        new = _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())
        Job, Activation = new.get_model("marketplace", "Job"), new.get_model("marketplace", "Activation")
        assert {code: Job.objects.get(pk=pk).reason_code for code, pk in jobs.items()} == {c: c for c in jobs}
        assert [Activation.objects.get(pk=pk).end_code for pk in ends.values()] == ["silent", "refused", "lost", ""]
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

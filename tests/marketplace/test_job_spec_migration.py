"""Migration 0019 moves a job's settings into ``Job.spec``: a job saved before it keeps every setting, and the way
back restores the columns."""

from __future__ import annotations

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor

from dataplane.jobs import parse_job_spec

BEFORE = [("marketplace", "0018_activation_observed_state")]


def _migrate(target):
    executor = MigrationExecutor(connection)
    executor.migrate(target)
    return executor.loader.project_state(target).apps


@pytest.mark.django_db(transaction=True)
def test_a_job_saved_before_keeps_every_setting_and_the_way_back_restores_them() -> None:
    from marketplace.reads.selectors import job_spec

    old = _migrate(BEFORE)
    owner = old.get_model("auth", "User").objects.create(username="owner")
    spec = parse_job_spec({"name": "old", "model_dir": "/models/tiny", "task": {"name": "arithmetic"}, "staleness": 5,
                           "batch_trajectories": 16, "group_size": 4, "gamma": 1.3, "loss": {"kl_beta": 0.05}})
    OldJob = old.get_model("marketplace", "Job")
    columns = {f.name for f in OldJob._meta.get_fields()}  # a JobSpec field added since 0019 has no column there
    job_id = OldJob.objects.create(owner=owner, **{k: v for k, v in spec.model_dump().items() if k in columns}).pk
    try:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())  # through 0019 to the models read below
        from marketplace.models import Job

        job = Job.objects.get(pk=job_id)
        settings = job.settings
        assert (settings.staleness, settings.kappa, settings.gamma, settings.loss.kl_beta, job.task) == (
            5, 4, 1.3, 0.05, spec.task)
        assert job_spec(job) == spec.model_dump(mode="json")

        back = _migrate(BEFORE).get_model("marketplace", "Job").objects.get(pk=job_id)
        assert (back.staleness, back.kappa, back.group_size, back.gamma) == (5, 4, 4, 1.3)
    finally:
        _migrate(MigrationExecutor(connection).loader.graph.leaf_nodes())

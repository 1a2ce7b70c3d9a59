"""The plan of a LoRA job takes its estimates from an earlier job that shipped the same adapter (docs/lora.md "What
the site plans with"): a full job's T_bcast moves the whole model, a LoRA job's a few MB."""

from __future__ import annotations

import pytest

from dataplane.jobs import parse_job_spec
from marketplace.models import Job
from marketplace.reads import scheduling

from . import factories

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

MODEL = factories.checkpoint_dir()
BODY = {"name": "next", "model_dir": MODEL, "task": {"name": "arithmetic"}, "staleness": 3, "batch_trajectories": 64,
        "group_size": 8}


def measured(owner, *, t_bcast: float, **spec) -> Job:
    job = factories.job(owner, staleness=3, batch_trajectories=64, **spec)
    Job.objects.filter(pk=job.pk).update(learner_t_train=10.0)
    job.snapshots.create(version=2, url="http://x/v2/", manifest={}, t_bcast=t_bcast)
    return job


def test_a_lora_jobs_estimates_come_from_a_job_that_shipped_the_same_adapter():
    owner = factories.user()
    full = measured(owner, t_bcast=40.0)
    rank8 = measured(owner, t_bcast=1.5, lora={"rank": 8})
    measured(owner, t_bcast=4.6, lora={"rank": 32})  # the newest, another adapter's size

    def source(**change):
        plan = scheduling.spec_plan(parse_job_spec({**BODY, **change}), user=owner)
        return plan["measurements"]["sources"]["t_bcast"]

    assert (source(lora={"rank": 8})["value"], source(lora={"rank": 8})["job"]["id"]) == (1.5, rank8.pk)
    assert (source()["value"], source()["job"]["id"]) == (40.0, full.pk)  # a full job's from a full job
    assert source(lora={"rank": 8, "target_modules": ["q_proj", "v_proj"]})["source"] == "none"

"""Checks run by ``tests/test_job_setting_one_place.py`` in a fresh interpreter where JobSpec has one more setting.

Not collected on its own (not ``test_*``): the setting must exist before anything imports JobSpec, as it would had
it been written in ``dataplane/jobs.py``. :func:`add_the_setting` does that, first thing, and nothing else: no
serializer, form, model, migration or learner code is told about ``warmup_steps``.
"""

from __future__ import annotations

import json
import tomllib

import pytest
from pydantic import Field


def add_the_setting() -> None:
    """The one place: a JobSpec field with its default, bounds and help (a subclass standing in for an edit)."""
    from dataplane import jobs

    class JobSpec(jobs.JobSpec):
        warmup_steps: int = Field(default=0, ge=0, le=10_000, description="Steps at a linearly rising learning rate.")

    JobSpec.__qualname__ = "JobSpec"
    jobs.JobSpec = JobSpec


def _body(**changes) -> dict:
    from tests.marketplace import factories

    return {"name": "j", "model_dir": factories.checkpoint_dir(), "task": {"name": "arithmetic"}, **changes}


@pytest.fixture
def api():
    from rest_framework.test import APIClient

    from tests.marketplace import factories

    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    return client


def test_the_api_schema_describes_it() -> None:
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    assert schema["components"]["schemas"]["Job"]["properties"]["warmup_steps"] == {
        "type": "integer", "minimum": 0, "maximum": 10_000, "default": 0,
        "description": "Steps at a linearly rising learning rate."}


@pytest.mark.django_db
def test_the_api_takes_it_and_the_job_file_and_the_learner_read_it(api) -> None:
    from dataplane.jobs import JobSpec
    from learner import trainer

    created = api.post("/api/jobs/", _body(warmup_steps=7), format="json")
    refused = api.post("/api/jobs/", _body(warmup_steps=-1), format="json")
    job_file = tomllib.loads(api.get(f"/api/jobs/{created.json()['id']}/spec/?format=toml").content.decode())
    as_learner_reads_it = api.get(f"/api/jobs/{created.json()['id']}/").json()  # learner/client.py SiteClient.job

    assert created.status_code == 201, created.content
    assert refused.status_code == 400 and "warmup_steps" in refused.json()["errors"]
    assert job_file["warmup_steps"] == 7
    assert trainer.JobSpec is JobSpec and JobSpec.model_validate(as_learner_reads_it).warmup_steps == 7


@pytest.mark.django_db
def test_a_job_created_before_it_existed_reads_its_default(api) -> None:
    from marketplace.models import Job

    job_id = api.post("/api/jobs/", _body(), format="json").json()["id"]
    job = Job.objects.get(pk=job_id)
    job.spec.pop("warmup_steps")  # as a row saved before the field was added
    job.save(update_fields=["spec"])

    assert Job.objects.get(pk=job_id).settings.warmup_steps == 0
    assert api.get(f"/api/jobs/{job_id}/spec/").json()["warmup_steps"] == 0


@pytest.mark.django_db
def test_it_needs_no_migration() -> None:
    from django.core.management import call_command

    call_command("makemigrations", "marketplace", check=True, dry_run=True, verbosity=0)  # exits 1 on a change


@pytest.mark.django_db
def test_the_launch_form_shows_and_takes_it() -> None:
    from frontend.forms import JobLaunchForm

    form = JobLaunchForm()
    assert form.fields["warmup_steps"].initial == 0
    assert form.fields["warmup_steps"].help_text == "Steps at a linearly rising learning rate."
    assert ("More settings", [form["warmup_steps"]]) in form.grouped()

    filled = JobLaunchForm(data={"name": "j", "model_dir": _body()["model_dir"], "task_name": "arithmetic",
                                 "learner_uplink_mbps": 100, "warmup_steps": 3})
    assert filled.is_valid(), filled.errors
    assert filled.spec.warmup_steps == 3


def test_echo2_job_submit_reads_it_from_a_job_file(tmp_path) -> None:
    from typer.testing import CliRunner

    from echo2_cli.cli import app

    path = tmp_path / "job.toml"
    path.write_text('name = "j"\nmodel_dir = "/models/tiny"\nwarmup_steps = 5\n[task]\nname = "arithmetic"\n')
    resolved = CliRunner().invoke(app, ["job", "submit", str(path), "--dry-run", "--json"])
    misspelt = CliRunner().invoke(app, ["job", "submit", str(path), "--dry-run", "--set", "warmup_step=5"])

    assert resolved.exit_code == 0, resolved.output
    assert json.loads(resolved.output)["warmup_steps"] == 5
    assert misspelt.exit_code != 0 and "did you mean warmup_steps?" in misspelt.output

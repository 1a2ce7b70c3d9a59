"""Creating a job by the API: an unknown key is a 400 naming it with the nearest known name, every bad field is
reported in one reply, and a job's resolved settings download as a job file (TOML, YAML or JSON) that creates
the same job again."""

from __future__ import annotations

import tomllib

import pytest
import yaml
from rest_framework.test import APIClient

from dataplane.jobfiles import read_job_text
from dataplane.jobs import parse_job_spec

from . import factories

pytestmark = pytest.mark.django_db


@pytest.fixture
def api() -> APIClient:
    client = APIClient()
    client.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(factories.user())}")
    return client


def body(**changes) -> dict:
    return {"name": "j", "model_dir": factories.checkpoint_dir(), "task": {"name": "arithmetic"}, **changes}


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"stalenes": 4}, "stalenes", "unknown key (did you mean staleness?)"),
    ({"loss": {"kl_bta": 0.05}}, "loss.kl_bta", "unknown key (did you mean loss.kl_beta?)"),
    ({"status": "running"}, "status", "read-only: set by the site, not a job setting"),
])
def test_an_unknown_key_is_a_400_naming_it(api, changes, field: str, reason: str) -> None:
    reply = api.post("/api/jobs/", body(**changes), format="json")

    assert reply.status_code == 400
    assert reply.json() == {"detail": f"{field}: {reason}", "errors": {field: [reason]}}
    assert api.get("/api/jobs/").json()["count"] == 0  # not created with the default in its place


def test_every_bad_field_is_in_one_reply(api) -> None:
    reply = api.post("/api/jobs/", body(stalenes=4, learning_rate=5, top_p=0, loss={"kl_bta": 1}), format="json")

    assert reply.status_code == 400
    errors = reply.json()["errors"]
    assert set(errors) == {"stalenes", "loss.kl_bta", "learning_rate", "top_p"}
    assert errors["learning_rate"] == ["Input should be less than or equal to 1"]
    assert reply.json()["detail"] == "stalenes: unknown key (did you mean staleness?) (and 3 more in errors)"


def test_the_plan_preview_takes_its_estimates_and_refuses_unknown_keys(api) -> None:
    ok = api.post("/api/jobs/plan/", body(t_train_s=2.0), format="json")
    bad = api.post("/api/jobs/plan/", body(t_train_s=-1, t_trian_s=2.0), format="json")

    assert ok.status_code == 200, ok.content
    assert bad.status_code == 400
    assert set(bad.json()["errors"]) == {"t_train_s", "t_trian_s"}


def test_the_resolved_spec_downloads_as_a_job_file_that_makes_the_same_job(api) -> None:
    created = api.post("/api/jobs/", body(staleness=5, loss={"type": "gspo", "max_grad_norm": None}), format="json")
    job_id = created.json()["id"]

    as_json = api.get(f"/api/jobs/{job_id}/spec/").json()
    as_toml = api.get(f"/api/jobs/{job_id}/spec/?format=toml")
    as_yaml = api.get(f"/api/jobs/{job_id}/spec/", HTTP_ACCEPT="application/yaml")

    assert (as_json["kappa"], as_json["loss"]["aggregation"], as_json["loss"]["max_grad_norm"]) == (
        4, "seq-mean-token-mean", None)  # the defaults resolved
    assert as_toml["Content-Type"].startswith("application/toml")
    assert as_toml["Content-Disposition"] == f'attachment; filename="job-{job_id}.toml"'
    assert yaml.safe_load(as_yaml.content) == as_json
    from_toml = tomllib.loads(as_toml.content.decode())
    assert "max_grad_norm" not in from_toml["loss"]  # TOML has no null: a comment says how to set it
    assert parse_job_spec(read_job_text(as_yaml.content.decode(), kind="yaml")).model_dump(mode="json") == as_json
    again = api.post("/api/jobs/", as_json, format="json")
    assert again.status_code == 201, again.content
    assert api.get(f"/api/jobs/{again.json()['id']}/spec/").json() == as_json


def test_another_owners_spec_is_a_404(api) -> None:
    job = factories.job(factories.user("someone-else"))
    reply = api.get(f"/api/jobs/{job.pk}/spec/?format=toml")
    assert reply.status_code == 404


def test_an_error_asked_for_as_yaml_is_yaml_in_the_error_shape(api) -> None:
    reply = api.get("/api/jobs/0/spec/?format=yaml")
    assert reply.status_code == 404
    assert yaml.safe_load(reply.content) == {"detail": "No Job matches the given query."}

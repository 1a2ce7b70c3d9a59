"""The launch page fills its form from an uploaded TOML or YAML job file (checked like a launch: every problem
listed, an unknown key with the nearest known name), and a form with several bad fields shows all of them."""

from __future__ import annotations

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile

from ..marketplace import factories
from .test_pages import LAUNCH, signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]

JOB_TOML = f"""
name = "from a file"
model_dir = "{factories.checkpoint_dir()}"
staleness = 5
learner_uplink_bps = 12_500_000

[task]
name = "arithmetic"
max_operand = 4

[loss]
kl_beta = 0.05
"""


def upload(name: str, text: str):
    client = signed_in(factories.user())
    return client.post("/jobs/new/", {"load": "1", "job_file": SimpleUploadedFile(name, text.encode())})


def test_a_job_file_fills_the_form_and_launches_nothing() -> None:
    reply = upload("job.toml", JOB_TOML)

    html = reply.content.decode()
    assert reply.status_code == 200
    assert 'value="from a file"' in html
    assert 'name="staleness" value="5"' in html
    assert 'name="learner_uplink_mbps" value="100.0"' in html
    assert 'name="loss_kl_beta" value="0.05"' in html
    assert "{&quot;max_operand&quot;: 4}" in html
    assert 'id="error-job_file"' not in html


def test_every_problem_of_a_job_file_is_listed_with_the_nearest_name() -> None:
    reply = upload("job.yaml", "name: x\nmodel_dir: /m\ntask: {name: arithmetic}\nstalenes: 4\nloss: {kl_bta: 1}\n"
                               "top_p: 0\n")

    html = reply.content.decode()
    assert "<li>stalenes: unknown key (did you mean staleness?)</li>" in html
    assert "<li>loss.kl_bta: unknown key (did you mean loss.kl_beta?)</li>" in html
    assert "<li>top_p: Input should be greater than 0</li>" in html


@pytest.mark.parametrize(("name", "text", "words"), [
    ("job.json", "{}", "a job file is .toml, .yaml or .yml"),
    ("job.toml", "name = ", "job.toml: not valid TOML"),
])
def test_an_unreadable_job_file_says_why(name: str, text: str, words: str) -> None:
    assert words in upload(name, text).content.decode()


def test_the_form_shows_every_bad_field_at_once() -> None:
    client = signed_in(factories.user())
    reply = client.post("/jobs/new/", {**LAUNCH, "top_p": 0, "learning_rate": 5, "loss_kl_beta": -1})

    html = reply.content.decode()
    assert 'id="error-top_p"' in html and 'id="error-learning_rate"' in html and 'id="error-loss_kl_beta"' in html

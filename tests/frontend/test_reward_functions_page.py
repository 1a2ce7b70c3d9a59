"""The job page shows each reward function the learner scores beside the reward chart: its mean over the reward
card's steps, the records it failed on of those it scored, and its last error's first line, from the step reports
(``extra.reward_functions``, learner/report.py); the API summary and ``echo2 job status`` carry the same rows; a
job whose workers score the whole reward shows no table (job.js fills it live from the summary)."""

from __future__ import annotations

import html
import re

import pytest
from rest_framework.test import APIClient

from echo2_cli.render import summary_rows
from marketplace import services
from marketplace.models import Job
from marketplace.reads.reward_functions import ERROR_WINDOW, function_rows

from ..marketplace import factories
from .test_pages import signed_in

pytestmark = [pytest.mark.django_db, pytest.mark.usefixtures("redis_url")]
CORRECT, BRIEF = "mypkg.rewards:correct", "mypkg.rewards:brief"
TRACEBACK = "mypkg.rewards:correct: KeyError: 'answer'\nTraceback (most recent call last): ..."


def report(step: int) -> dict:
    """Step ``step``'s figures of two functions: ``correct`` fails on 2 of 16 records at steps 3 and 9 only."""
    fails = 2 if step in (3, 9) else 0
    return {CORRECT: {"mean": step / 100, "records": 16, "errors": fails,
                      "last_error": TRACEBACK if step >= 3 else ""},
            BRIEF: {"mean": 0.5, "records": 16, "errors": 0, "last_error": ""}}


def cells(page: str, function: str) -> dict[str, str]:
    row = re.search(rf'<tr data-function="{re.escape(function)}">(.*?)</tr>', page, re.S)
    assert row, f"no row for {function}"
    return {name: html.unescape(text).strip() for name, text in re.findall(r'<td class="([\w-]+)">(.*?)</td>',
                                                                            row.group(1), re.S)}


def test_each_function_has_its_mean_its_error_rate_and_its_last_error_beside_the_reward_chart():
    owner = factories.user()
    job = services.job_start(job=factories.job(owner))
    for step in range(1, 13):
        services.metrics_record(job=Job.objects.get(pk=job.pk), step=step, values={
            "reward_mean": 0.1, "extra": {"reward_functions": report(step)}})

    page = signed_in(owner).get(f"/jobs/{job.pk}/").content.decode()

    assert page.index('id="reward-curve"') < page.index('id="reward-functions"') < page.index('id="time-chart"')
    correct = cells(page, CORRECT)
    assert correct["mean"] == f"{sum(range(3, 13)) / 1000:.3f}"  # the reward card's 10 steps: 3..12
    assert correct["errors"] == "2.1% (4 of 192)"
    assert correct["last-error"] == "mypkg.rewards:correct: KeyError: 'answer'"  # the first line alone
    assert cells(page, BRIEF) == {"mean": "0.500", "errors": "0.0% (0 of 192)", "last-error": "none"}

    api = APIClient()
    api.credentials(HTTP_AUTHORIZATION=f"Token {factories.token(owner)}")
    rows = {r["function"]: r for r in api.get(f"/api/jobs/{job.pk}/summary/").json()["reward_functions"]}
    assert rows[CORRECT]["errors"] == 4 and rows[CORRECT]["records"] == 192 and rows[BRIEF]["error_rate"] == 0.0
    status = dict(summary_rows(api.get(f"/api/jobs/{job.pk}/summary/").json()))  # echo2 job status says the same
    assert status[f"  {CORRECT}"] == (f"mean {correct['mean']}, errors 2.1% (4 of 192); last: mypkg.rewards:correct: "
                                      "KeyError: 'answer'")

    plain = services.job_start(job=factories.job(owner))  # the workers score the whole reward: no table
    services.metrics_record(job=Job.objects.get(pk=plain.pk), step=1, values={"reward_mean": 0.3})
    # its table is there for job.js to fill when a report carries functions, hidden until then
    assert 'id="reward-functions" hidden>' in signed_in(owner).get(f"/jobs/{plain.pk}/").content.decode()


def test_what_a_learner_reports_wrongly_is_left_out_and_the_error_window_is_the_newest_steps():
    rows = function_rows([{"f": {"mean": "high", "records": -3, "errors": True, "last_error": 7}}, "junk", None])
    assert rows == [{"function": "f", "mean": None, "mean_steps": 0, "records": 0, "errors": 0, "error_rate": None,
                     "error_percent": None, "last_error": "", "steps": 1}]
    old = {"f": {"mean": 1.0, "records": 8, "errors": 8, "last_error": "f: boom"}}
    new = {"f": {"mean": 1.0, "records": 8, "errors": 0, "last_error": ""}}
    rows = function_rows([new] * (ERROR_WINDOW - 1) + [old])  # what the site reads: the newest ERROR_WINDOW steps
    assert rows[0]["errors"] == 8 and rows[0]["last_error"] == "f: boom"

"""The owner's reward functions failing on the learner (learner/scoring.py) count with the workers' failures: a step
report's ``extra.reward_errors`` reaches the job's summary (the job page and ``echo2 job status`` show the line),
once per step even when the report is sent again."""

from __future__ import annotations

import pytest

from echo2_cli.render import summary_rows
from marketplace import services
from marketplace.reads import selectors

from . import factories

pytestmark = [pytest.mark.usefixtures("redis_url"), pytest.mark.django_db]


def test_the_learners_reward_errors_reach_the_summary_and_echo2_job_status() -> None:
    job = factories.job(factories.user())
    services.job_start(job=job)
    values = {"reward_mean": 0.1, "extra": {"reward_errors": 3, "reward_last_error":
                                            "mypkg.rewards:correct: KeyError: 'answer'"}}

    services.metrics_record(job=job, step=1, values=values)
    services.metrics_record(job=job, step=1, values=values)  # the same report again (a resend)
    services.metrics_record(job=job, step=2, values={"reward_mean": 0.2, "extra": {"reward_errors": 0}})

    summary = selectors.job_summary(job)
    assert summary["reward_errors_line"] == "3 (last: mypkg.rewards:correct: KeyError: 'answer')"
    rows = dict(summary_rows(summary))
    assert rows["reward function errors"] == "3 (last: mypkg.rewards:correct: KeyError: 'answer')"

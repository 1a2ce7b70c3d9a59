"""``echo2 job samples`` against a live site: the samples the learner reported, newest step first, as a table and as
JSON, filtered by reward; a bad filter is one line naming it; a job without samples says so."""

from __future__ import annotations

import json

import pytest
from django.utils import timezone

from marketplace.models import Job
from marketplace.services.samples import samples_record

from ..marketplace import factories
from .test_cli import echo2, one_line_error


@pytest.mark.django_db(transaction=True)
def test_job_samples_table_json_and_filters(live_server, tmp_path, redis_url) -> None:
    user = factories.user("owner")
    token_file = tmp_path / "owner.token"
    token_file.write_text(factories.token(user) + "\n")
    token_file.chmod(0o600)
    env = {"ECHO2_SERVER": live_server.url, "ECHO2_TOKEN_FILE": str(token_file)}
    job = factories.job(user)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now())
    assert "no samples yet" in echo2("job", "samples", str(job.pk), env=env).stdout
    samples_record(job=job, step=10, rows=[
        {"version": 9, "worker": 4, "reward": 1.0, "prompt": "What is 3+4?", "completion": "7"},
        {"version": 8, "worker": 5, "reward": 0.0, "prompt": "What is 2+2?", "completion": "five"}])
    samples_record(job=job, step=20, rows=[{"version": 19, "worker": 4, "reward": 0.5, "prompt": "9-1?",
                                            "completion": "8"}])

    table = echo2("job", "samples", str(job.pk), env=env)
    assert table.returncode == 0, table.stderr
    assert table.stdout.index("9-1?") < table.stdout.index("What is 3+4?") < table.stdout.index("What is 2+2?")
    assert "v19" in table.stdout and "five" in table.stdout
    rows = json.loads(echo2("job", "samples", str(job.pk), "--min-reward", "0.75", "--json", env=env).stdout)
    assert [(r["step"], r["worker"], r["completion"]) for r in rows] == [(10, 4, "7")]
    rows = json.loads(echo2("job", "samples", str(job.pk), "--max-reward", "0.5", "-n", "1", "--json",
                            env=env).stdout)
    assert [r["completion"] for r in rows] == ["8"]
    assert one_line_error(echo2("job", "samples", str(job.pk), "--min-reward", "1", "--max-reward", "0", env=env),
                          2) == f"GET /api/jobs/{job.pk}/samples/: min_reward: 1.0 is above max_reward 0.0"

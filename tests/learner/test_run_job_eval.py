"""A real ``echo2-learner`` with the job setting ``eval`` against a live site: it scores the base before the first
update, every 2 updates and after the last; the results reach the step reports (the API), ``echo2 job status``,
the job page's data and TensorBoard, each at the version it scored, with the time it took in the step's split."""

from __future__ import annotations

import json

import pytest
import redis
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from ..echo2_cli.test_cli import echo2
from ..live import owner_site, start_learner
from .test_run_job_resume import push_groups

pytestmark = pytest.mark.slow

R, N = 4, 2


def test_the_learner_evaluates_before_between_and_after_and_reports_it(stack, tmp_path, tiny_model_dir,
                                                                         redis_url) -> None:
    server, owner, token_file = owner_site(stack, tmp_path)
    job = owner.post("jobs/", json={
        "name": "eval", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 50, "kappa": 2, "batch_trajectories": R, "group_size": N, "max_steps": 3, "max_new_tokens": 2,
        "eval": {"before": True, "after": True, "every": 2, "problems": 6, "k": 2},
    }).raise_for_status().json()
    assert job["eval"]["every"] == 2 and job["eval"]["split"] is None  # the API shows the setting, defaults filled
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    learner = start_learner(stack, server, job["id"], token_file, redis_url, "--snapshot-dir",
                            str(tmp_path / "snapshots"), "--data-timeout", "120")
    push_groups(redis.Redis.from_url(redis_url), job["id"], 0, 3 * R // N)
    learner.wait(timeout=180)
    log = (stack.logs / "learner.log").read_text()
    assert learner.returncode == 0, log[-3000:]
    for version in (0, 2, 3):
        assert f"eval v{version}: pass@1 " in log and "on 6 problems" in log

    metrics = owner.get(f"jobs/{job['id']}/metrics/").json()
    evals = {m["step"]: [e["version"] for e in m["extra"].get("eval", [])] for m in metrics}
    assert evals == {1: [0], 2: [2], 3: [3]}  # the base's rides on step 1's report
    for m in metrics:
        for e in m["extra"].get("eval", []):
            assert 0.0 <= e["pass_at_1"] <= 1.0 and 0.0 <= e["mean_at_k"] <= 1.0 and len(e["correct"]) == 6
    step2 = next(m for m in metrics if m["step"] == 2)
    assert step2["extra"]["timing"]["eval"] == pytest.approx(step2["extra"]["eval"][0]["seconds"])

    cli = {"ECHO2_SERVER": server, "ECHO2_TOKEN_FILE": str(token_file)}
    status = echo2("job", "status", str(job["id"]), "--json", env=cli)
    summary = json.loads(status.stdout)["summary"]["eval"]
    assert (summary["first"]["version"], summary["last"]["version"], summary["count"]) == (0, 3, 3)
    table = echo2("job", "status", str(job["id"]), env=cli).stdout
    assert "held-out pass@1" in table and "at v0" in table and "at v3" in table and "on 6 problems" in table

    page = owner.get(f"jobs/{job['id']}/live/").json()  # what the job page's charts draw
    assert [(e["version"], e["problems"]) for point in page["metrics"] for e in point["eval"]] == [(0, 6), (2, 6),
                                                                                                  (3, 6)]

    events = EventAccumulator(str(tmp_path / "runs" / f"job{job['id']}"))  # ECHO2_LOGDIR (tests/live.py)
    events.Reload()
    assert [e.step for e in events.Scalars("eval/pass_at_1")] == [0, 2, 3]
    assert [e.step for e in events.Scalars("eval/mean_at_k")] == [0, 2, 3]

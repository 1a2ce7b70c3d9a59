"""A real ``echo2-learner`` on a live site with the owner's reward functions (scored on the learner,
learner/scoring.py): one that raises stops the job before step 1, and ``echo2 job status`` shows its traceback;
one that works is added to the workers' rewards before the advantages, each step reports its mean, and a group
whose worker claims a reward for it is quarantined, never trained."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis

from dataplane import replay
from dataplane.dataset import content

from ..echo2_cli.test_cli import echo2
from ..groups import stream_fields
from ..live import owner_site, start_learner

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SUMS = ROOT / "examples" / "data" / "sums.parquet"


def started(stack, tmp_path, model_dir, redis_url, reward: str, *, before=None) -> tuple[dict, str, object]:
    """A running dataset job on the sums rewarded by ``reward`` (the learner serves the data set), ``before(job)``
    called, then its learner (the owner's module importable there only), waited for; (job, server, owner client)."""
    server, owner, token_file = owner_site(stack, tmp_path)
    job = owner.post("jobs/", json={
        "name": "owner-reward", "model_dir": str(model_dir), "batch_trajectories": 4, "group_size": 2,
        "max_steps": 3, "max_new_tokens": 2, "staleness": 50,
        "task": {"name": "dataset", "reward": reward,
                 "data": {"digest": content.digest(SUMS), "format": "parquet", "source": "learner",
                          "prompt_column": "question"}},
    }).raise_for_status().json()
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    if before is not None:
        before(job)
    stack.env["PYTHONPATH"] = str(ROOT)  # the owner's module, on the owner's machine only
    learner = start_learner(stack, server, job["id"], token_file, redis_url, "--snapshot-dir",
                            str(tmp_path / "snapshots"), "--data-timeout", "60", "--dataset", str(SUMS))
    learner.wait(timeout=240)
    return job, server, owner


def push(client: redis.Redis, job_id: int, groups: int, *, claimed: float = 0.0, first: int = 0) -> None:
    """Groups of "3+4=" answered "7" and "5", as workers return them: the built-ins' part of the reward (none here,
    so 0), or a forged ``claimed`` one."""
    for g in range(first, first + groups):
        records = [{"job_id": job_id, "lease_id": f"l{g}", "group_id": f"g{g}", "prompt": "3+4=",
                    "prompt_ids": [1, 10, 5, 11, 17], "completion": answer, "completion_ids": [7 + int(answer), 2],
                    "logprobs": [-2.0, -1.0], "reward": claimed, "version": 0} for answer in ("7", "5")]
        client.xadd(replay.trajectories_key(job_id), stream_fields(records))


def test_the_learner_adds_the_owners_scores_and_quarantines_a_forged_claim(stack, tmp_path, tiny_model_dir,
                                                                            redis_url) -> None:
    pytest.importorskip("datasets")
    client = redis.Redis.from_url(redis_url)

    def groups(job: dict) -> None:
        push(client, job["id"], 1, claimed=1.0)  # a worker claiming a score it does not compute
        push(client, job["id"], 6, first=1)

    job, _, owner = started(stack, tmp_path, tiny_model_dir, redis_url, "tests.owner_rewards:correct", before=groups)
    log = (stack.logs / "learner.log").read_text()
    assert "step 3 " in log, log[-3000:]
    metrics = owner.get(f"jobs/{job['id']}/metrics/").json()
    assert [m["step"] for m in metrics] == [1, 2, 3]
    for m in metrics:  # "7" scores 1.0, "5" 0.1: the learner's scores, the workers claimed 0
        assert m["reward_mean"] == pytest.approx(0.55) and m["extra"]["reward_errors"] == 0, m
        assert m["extra"]["rewards"] == {"tests.owner_rewards:correct": pytest.approx(0.55)}
        assert m["extra"]["completion_length"] == {"mean": 2.0, "max": 2.0, "clipped_ratio": 1.0}
    assert sum(metrics[-1]["extra"]["quarantined"].values()) == 2, "the forged group: quarantined, not trained"


def test_a_raising_reward_function_fails_the_job_before_step_1_with_its_traceback(stack, tmp_path, tiny_model_dir,
                                                                                   redis_url) -> None:
    pytest.importorskip("datasets")
    job, server, owner = started(stack, tmp_path, tiny_model_dir, redis_url, "tests.owner_rewards:broken")
    token_file = tmp_path / "token"
    log = (stack.logs / "learner.log").read_text()
    assert "step 1 " not in log, log[-3000:]

    cli = {"ECHO2_SERVER": server, "ECHO2_TOKEN_FILE": str(token_file), "COLUMNS": "200"}
    status = echo2("job", "status", str(job["id"]), env=cli).stdout
    assert "failed (reward function tests.owner_rewards:broken raised" in status, status
    assert 'owner_rewards.py", line' in status and "ZeroDivisionError: division by zero" in status, status
    assert owner.get(f"jobs/{job['id']}/metrics/").json() == []

"""A real ``echo2-learner`` on a live site with the owner's reward functions (scored on the learner,
learner/scoring.py): one that raises stops the job before step 1, and ``echo2 job status`` shows its traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from dataplane.dataset import content

from ..echo2_cli.test_cli import echo2
from ..live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
SUMS = ROOT / "examples" / "data" / "sums.parquet"


def test_a_raising_reward_function_fails_the_job_before_step_1_with_its_traceback(stack, tmp_path, tiny_model_dir,
                                                                                   redis_url) -> None:
    pytest.importorskip("datasets")
    token = create_users(stack, "own")["own"]
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    server = start_site(stack, celery=False)
    owner = api(server, token)
    job = owner.post("jobs/", json={
        "name": "broken-reward", "model_dir": str(tiny_model_dir), "batch_trajectories": 4, "group_size": 2,
        "max_steps": 3, "max_new_tokens": 2,
        "task": {"name": "dataset", "reward": "tests.owner_rewards:broken",
                 "data": {"digest": content.digest(SUMS), "format": "parquet", "source": "learner",
                          "prompt_column": "question"}},
    }).raise_for_status().json()
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    stack.env["PYTHONPATH"] = str(ROOT)  # the owner's module, on the owner's machine only
    learner = stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]),
                          "--token-file", str(token_file), "--redis", redis_url, "--snapshot-dir",
                          str(tmp_path / "snapshots"), "--data-timeout", "60", "--audit-fraction", "0",
                          "--dataset", str(SUMS))
    learner.wait(timeout=180)
    log = (stack.logs / "learner.log").read_text()
    assert "step 1 " not in log, log[-3000:]

    cli = {"ECHO2_SERVER": server, "ECHO2_TOKEN_FILE": str(token_file), "COLUMNS": "200"}
    status = echo2("job", "status", str(job["id"]), env=cli).stdout
    assert "failed (reward function tests.owner_rewards:broken raised" in status, status
    assert 'owner_rewards.py", line' in status and "ZeroDivisionError: division by zero" in status, status
    assert owner.get(f"jobs/{job['id']}/metrics/").json() == []

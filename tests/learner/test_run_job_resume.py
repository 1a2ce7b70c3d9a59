"""``echo2-learner`` killed mid-job against a real site (daphne) and Redis, then restarted: it refuses to
start without its checkpoint, and with it resumes the same version sequence and completes the job. Once as
one process, once as two data-parallel CPU ranks under torchrun (rank 0 talks to the site, both train), once
as two FSDP ranks (sharded checkpoints; snapshots gathered tensor by tensor from both)."""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
from pathlib import Path

import pytest
import redis

from dataplane import replay
from echo2_site.demo import wait_for

from ..groups import stream_fields
from ..live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

STEPS, R, N = 6, 4, 2  # kappa = 2: checkpoint and publish at v2, v4, v6


def push_groups(client: redis.Redis, job_id: int, first: int, count: int) -> None:
    """Append accepted groups the way the site does (marketplace/infra/stream.py), generated under v0."""
    for g in range(first, first + count):
        records = [{"job_id": job_id, "lease_id": f"l{g}", "group_id": f"g{g}", "prompt": "3+4=",
                    "prompt_ids": [1, 10, 5, 11, 17], "completion": answer, "completion_ids": [7 + int(answer), 2],
                    "logprobs": [-2.0, -1.0], "reward": reward, "version": 0}
                   for answer, reward in (("7", 1.0), ("5", 0.0))]
        client.xadd(replay.trajectories_key(job_id), stream_fields(records))


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and all its descendants (torchrun starts its ranks in sessions of their own)."""
    def descendants(p: int) -> list[int]:
        out = []
        for task in Path(f"/proc/{p}/task").glob("*"):
            try:
                children = (task / "children").read_text().split()
            except OSError:
                continue
            for child in map(int, children):
                out += [child, *descendants(child)]
        return out

    for p in [pid, *descendants(pid)]:  # the whole tree is listed before anything dies
        with contextlib.suppress(ProcessLookupError):
            os.kill(p, signal.SIGKILL)


@pytest.mark.parametrize(("ranks", "parallel"), [(1, "ddp"), (2, "ddp"), (2, "fsdp")],
                         ids=["one-process", "torchrun-2-ranks", "torchrun-2-fsdp-ranks"])
def test_learner_killed_mid_job_resumes_from_its_checkpoint(stack, tmp_path, tiny_model_dir, redis_url,
                                                            ranks: int, parallel: str) -> None:
    token = create_users(stack, "own")["own"]
    server = start_site(stack, celery=False)
    owner = api(server, token)
    job = owner.post("jobs/", json={
        "name": "resume", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 50, "kappa": 2, "batch_trajectories": R, "group_size": N, "max_steps": STEPS,
        "max_new_tokens": 2, "learning_rate": 1e-2,
    }).raise_for_status().json()
    owner.post(f"jobs/{job['id']}/start/").raise_for_status()
    client = redis.Redis.from_url(redis_url)
    checkpoint_dir = tmp_path / "snapshots" / f"job{job['id']}-checkpoint"
    launcher = [str(BIN / "echo2-learner")] if ranks == 1 else \
        [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", str(ranks), "-m", "learner.cli"]
    token_file = tmp_path / "owner.token"
    token_file.write_text(token)
    learner = [*launcher, "--server", server, "--job", str(job["id"]), "--token-file", str(token_file), "--redis",
               redis_url, "--snapshot-dir", str(tmp_path / "snapshots"), "--data-timeout", "120",
               "--audit-fraction", "0",  # the groups here are made up: no engine computed their log-probs
               "--parallel", parallel]

    # --- enough data for 3 updates: v2 is checkpointed and published, v3 is trained, then the learner waits
    push_groups(client, job["id"], 0, 3 * R // N)
    first = stack.start("learner-1", *learner)
    wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["learner_step"] == 3, "three updates", 120)
    kill_tree(first.pid)
    first.wait()
    assert owner.get(f"jobs/{job['id']}/").json()["published_version"] == 2
    if parallel == "fsdp":  # the model and optimizer are in the ranks' shards, beside a small checkpoint.pt
        assert len(list(checkpoint_dir.glob("sharded-v00000002-*/*.distcp"))) == ranks

    # --- without its checkpoint the learner refuses, in one line
    shutil.move(checkpoint_dir, tmp_path / "elsewhere")
    refused = subprocess.run(learner, capture_output=True, text=True, timeout=120, env=stack.env)
    assert refused.returncode == 1
    assert "already trained 3 steps but there is no checkpoint" in refused.stderr
    if ranks == 1:  # (torchrun adds its own report of the failed ranks)
        # one error line and no traceback; the log lines before it (where the streams are) are progress, not errors
        errors = [line for line in refused.stderr.splitlines() if not line[:8].replace(":", "").isdigit()]
        assert len(errors) == 1 and errors[0].startswith("echo2-learner: error:"), refused.stderr
    shutil.move(tmp_path / "elsewhere", checkpoint_dir)

    # --- with it, the learner resumes at v2, trains v3 again on the same groups, and completes
    push_groups(client, job["id"], 3 * R // N, 3 * R // N)
    second = stack.start("learner-2", *learner)
    second.wait(timeout=180)
    log = (stack.logs / "learner-2.log").read_text()
    assert second.returncode == 0, log[-3000:]
    assert "resumed at v2" in log and f"{ranks} rank(s)" in log
    assert ("sharded (FSDP)" in log) == (parallel == "fsdp")
    final = owner.get(f"jobs/{job['id']}/").json()
    assert final["status"] == "completed", final["status_reason"]
    assert final["published_version"] == STEPS
    snaps = owner.get(f"jobs/{job['id']}/snapshots/").json()
    versions = [s["version"] for s in snaps]
    # The base once (the restart did not publish it again), every kappa-th version after it, the last one: a full
    # snapshot written before the one before it was announced replaces it in the outbox (agents want the newest),
    # so v4 may be left out when v6 follows it quickly; nothing else may be, and none twice.
    assert versions in ([0, 2, 4, 6], [0, 2, 6]), versions
    assert "base snapshot v0 already published" in log
    # The restarted learner serves from new ports: the base and v2 were announced again from there, or an agent
    # still fetching v2 (or joining later, for the base) would wait on the dead process's address.
    moved_to = re.search(r"snapshots at (http://\S+/)v0/", log).group(1)
    assert all(s["url"] == f"{moved_to}v{s['version']}/" for s in snaps), (moved_to, snaps)
    metrics = owner.get(f"jobs/{job['id']}/metrics/").json()
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    steps_logged = [int(line.split("step ")[1].split()[0]) for line in log.splitlines() if " step " in line]
    assert steps_logged == [3, 4, 5, 6]

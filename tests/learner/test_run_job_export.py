"""A real ``echo2-learner`` against a live site (daphne): while it runs, ``echo2 job export`` downloads a published
snapshot through the site; its TensorBoard log holds every step; the final step (not a multiple of kappa) is
published as the job ends; afterwards the site says the learner is gone and ``echo2-learner export`` exports
that final model from the learner's disk."""

from __future__ import annotations

import json

import pytest
import redis
import torch
from safetensors.torch import load_file
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from dataplane.broadcast.store import read_manifest
from echo2_site.demo import wait_for

from ..echo2_cli.test_cli import echo2, one_line_error
from ..live import BIN, owner_site, start_learner
from .test_run_job_resume import push_groups

pytestmark = pytest.mark.slow

R, N = 4, 2


def test_export_while_training_final_publication_and_tensorboard(stack, tmp_path, tiny_model_dir,
                                                                 redis_url) -> None:
    server, owner, token_file = owner_site(stack, tmp_path)
    job = owner.post("jobs/", json={
        "name": "export", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
        "staleness": 50, "kappa": 2, "batch_trajectories": R, "group_size": N, "max_steps": 3, "max_new_tokens": 2,
    }).raise_for_status().json()
    job_url, snapshots = f"jobs/{job['id']}/", tmp_path / "snapshots"
    owner.post(job_url + "start/").raise_for_status()
    client = redis.Redis.from_url(redis_url)
    learner = start_learner(stack, server, job["id"], token_file, redis_url, "--snapshot-dir", str(snapshots),
                            "--data-timeout", "120")
    cli = {"ECHO2_SERVER": server, "ECHO2_TOKEN_FILE": str(token_file)}

    push_groups(client, job["id"], 0, 2 * R // N)
    wait_for(lambda: owner.get(job_url).json()["published_version"] == 2, "v2 published", 120)
    done = echo2("job", "export", str(job["id"]), "--out", str(tmp_path / "v2"), "--json", env=cli)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["version"] == 2
    v2 = load_file(tmp_path / "v2" / "model.safetensors")
    assert not torch.equal(v2["model.norm.weight"], torch.ones_like(v2["model.norm.weight"]))  # trained

    push_groups(client, job["id"], 2 * R // N, R // N)
    learner.wait(timeout=120)
    log = (stack.logs / "learner.log").read_text()
    assert learner.returncode == 0, log[-3000:]
    final = owner.get(job_url).json()
    assert final["status"] == "completed" and final["published_version"] == 3, final  # the final model, v3
    assert f"job {job['id']}: published the final model as v3" in log

    events = EventAccumulator(str(tmp_path / "runs" / f"job{job['id']}"))  # ECHO2_LOGDIR (tests/live.py)
    events.Reload()
    assert [e.step for e in events.Scalars("reward/mean")] == [1, 2, 3]
    assert [e.step for e in events.Scalars("step_time/train_share")] == [1, 2, 3]

    gone = echo2("job", "export", str(job["id"]), "--out", str(tmp_path / "gone"), env=cli)
    unreachable = "the learner's snapshot server could not be reached (it serves snapshots only while it runs)"
    assert unreachable in one_line_error(gone, 1)
    offline = stack.run(str(BIN / "echo2-learner"), "export", "--job", str(job["id"]), "--snapshot-dir",
                        str(snapshots), "--out", str(tmp_path / "final"))
    assert json.loads(offline.strip().splitlines()[-1])["version"] == 3
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(tmp_path / "final")
    checkpoint = torch.load(snapshots / f"job{job['id']}-checkpoint" / "checkpoint.pt", weights_only=True)
    written = load_file(tmp_path / "final" / "model.safetensors")
    assert read_manifest(snapshots / f"job{job['id']}", 3).dtype == "bf16"
    for name, tensor in written.items():  # the learner's bf16 cast of its final weights, bit for bit
        assert tensor.dtype == torch.bfloat16 and torch.equal(tensor, checkpoint["model"][name].bfloat16()), name

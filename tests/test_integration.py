"""The whole path on loopback with real processes: daphne, a Celery worker, Redis, the learner, two agents.

A third, hand-driven agent holds a lease until its version is too old and then returns it, so the
test sees a stale group flow through the site and get dropped (and counted) by the learner.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load
from websockets.sync.client import connect

from dataplane.broadcast.store import full_payload, iter_chunks
from echo2_site.demo import wait_for

from .live import BIN, api, create_users, start_site

pytestmark = pytest.mark.slow

STEPS, S, R, N = 12, 2, 16, 4


def recv(ws, *types: str, timeout: float = 30.0) -> dict:
    """The next message of one of ``types`` (pushes such as snapshots may arrive in between)."""
    deadline = time.monotonic() + timeout
    while True:
        message = json.loads(ws.recv(timeout=max(0.1, deadline - time.monotonic())))
        if message["type"] in types:
            return message


def test_jobs_train_end_to_end_and_drop_stale_records(stack, tmp_path, tiny_model_dir):
    tokens = create_users(stack, "own", "prov")
    server = start_site(stack)
    port = server.rsplit(":", 1)[1]

    token_files = {}
    for user, token in tokens.items():  # as the docs say: secrets in files, not on command lines
        token_files[user] = tmp_path / f"{user}.token"
        token_files[user].write_text(token + "\n")
        token_files[user].chmod(0o600)
    for name in ("a", "b"):
        cfg = tmp_path / f"agent-{name}.json"
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token-file", str(token_files["prov"]),
                  "--name", name, "--price", "0.3", "--config", str(cfg))
        assert oct(cfg.stat().st_mode & 0o777) == "0o600"
        stack.start(f"agent-{name}", str(BIN / "echo2-agent"), "run", "--config", str(cfg), "--threads", "1")

    owner, provider = api(server, tokens["own"]), api(server, tokens["prov"])
    slow = provider.post("workers/", json={"name": "slow", "price_per_hour": "0.1", "bandwidth_bps": 1000}).json()
    with connect(f"ws://127.0.0.1:{port}/ws/agent/",
                 additional_headers={"Authorization": f"Bearer {slow['agent_key']}"}) as ws:
        ws.send(json.dumps({"type": "hello", "agent_version": "test"}))
        recv(ws, "welcome")
        wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"]) == 3,
                 "three idle workers", 60)

        job = owner.post("jobs/", json={
            "name": "it", "model_dir": str(tiny_model_dir), "task": {"name": "arithmetic", "max_operand": 4},
            "staleness": S, "batch_trajectories": R, "group_size": N, "max_steps": STEPS, "max_new_tokens": 2,
        }).raise_for_status().json()
        owner.post(f"jobs/{job['id']}/start/").raise_for_status()
        assert recv(ws, "assign")["job_id"] == job["id"]
        stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job["id"]),
                    "--token-file", str(token_files["own"]), "--redis", stack.env["REDIS_URL"],
                    "--snapshot-dir", str(tmp_path / "snapshots"),
                    "--data-timeout", "60",
                    "--audit-fraction", "0")  # the hand-made stale group's log-probs are made up: not audited

        # The slow worker leases one group and sits on it until its version 0 is older than S.
        while True:
            ws.send(json.dumps({"type": "lease_request", "job_id": job["id"]}))
            reply = recv(ws, "lease", "no_work")
            if reply["type"] == "lease":
                lease = reply["leases"][0]
                break
            time.sleep(0.2)
        wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["learner_step"] >= S + 2, "the learner to advance", 120)
        stale = [{"job_id": job["id"], "lease_id": lease["lease_id"], "group_id": lease["group_id"],
                  "prompt": lease["prompt"], "prompt_ids": [1, 5], "completion": "1", "completion_ids": [4, 2],
                  "logprobs": [-2.0, -1.0], "reward": 0.0, "version": 0} for _ in range(N)]
        ws.send(json.dumps({"type": "trajectories", "group": {
            "job_id": job["id"], "lease_id": lease["lease_id"], "group_id": lease["group_id"], "version": 0,
            "records": stale}}))
        assert recv(ws, "accepted")["accepted"] == N

        wait_for(lambda: owner.get(f"jobs/{job['id']}/").json()["status"] != "running", "the job to finish", 180)
    final = owner.get(f"jobs/{job['id']}/").json()
    assert final["status"] == "completed", final["status_reason"]
    assert final["published_version"] == STEPS  # kappa = S - 1 = 1: a snapshot every step

    metrics = owner.get(f"jobs/{job['id']}/metrics/").json()
    assert [m["step"] for m in metrics] == list(range(1, STEPS + 1))
    assert max(m["max_staleness"] for m in metrics) <= S
    assert metrics[-1]["dropped_stale"] >= N  # our stale group, dropped and counted

    summary = owner.get(f"jobs/{job['id']}/summary/").json()
    assert summary["counters"]["accepted_records"] >= STEPS * R + N
    # Installs as the site recorded them (the slow hand-driven worker reports none), not a worker's current
    # installed_version, which describes the agent now, after its release.
    snaps = owner.get(f"jobs/{job['id']}/snapshots/").json()
    assert any(s["installs"] for s in snaps), f"agents never installed a published snapshot: {snaps}"

    # The learner's CLI refuses what it cannot do with one line and a non-zero exit.
    for job_id, reason in ((job["id"], "is completed; only a running (or paused) job can be trained"), (9999, "404")):
        done = subprocess.run([str(BIN / "echo2-learner"), "--server", server, "--job", str(job_id), "--token-file",
                               str(token_files["own"]), "--redis", stack.env["REDIS_URL"]], capture_output=True,
                              text=True, timeout=120)
        assert done.returncode == 1 and reason in done.stderr and len(done.stderr.strip().splitlines()) == 1

    # The published weights (the newest version's full payload, bf16) differ from the base checkpoint's cast:
    # training changed the parameters.
    manifest, directory = full_payload(tmp_path / "snapshots" / f"job{job['id']}", STEPS)
    trained = load(b"".join(iter_chunks(directory, manifest)))
    base = load((Path(tiny_model_dir) / "model.safetensors").read_bytes())
    assert manifest.dtype == "bf16" and all(t.dtype == torch.bfloat16 for t in trained.values())
    assert any(not torch.equal(trained[k], base[k].to(torch.bfloat16)) for k in trained)

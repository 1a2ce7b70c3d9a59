"""Kill the learner's core loop with SIGKILL between a checkpoint and the next one, restart it, and check the
invariant: versions continue, no acknowledged record is untrained, none is trained twice, none is lost,
and the resumed run ends exactly where an uninterrupted one does."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from dataplane import replay

from ..groups import entry_ids, stream_fields

pytestmark = pytest.mark.slow

WORKER = str(Path(__file__).parent / "loop_worker.py")
KILLED, CLEAN = 21, 22
GROUPS, MAX_STEPS = 16, 7  # 2 groups per update: 14 groups trained, 2 left in the stream
PLUS, DIGIT, EQUALS = 5, 7, 17  # the tiny arithmetic tokenizer: <pad> <s> </s> ' ' '*' '+' '-' '0'..'9' '='


def append_groups(client, job_id: int) -> list[str]:
    ids = []
    for g in range(GROUPS):
        a, b = g % 5, (g * 3) % 5
        records = [{"job_id": job_id, "lease_id": f"lease-{g}", "group_id": f"g{g}", "prompt": f"{a}+{b}=",
                    "prompt_ids": [1, DIGIT + a, PLUS, DIGIT + b, EQUALS], "completion": answer,
                    "completion_ids": [DIGIT + int(answer), 2], "logprobs": [-2.3, -1.0], "reward": reward,
                    "version": 0}
                   for answer, reward in ((str((a + b) % 10), 1.0), (str((a + b + 1) % 10), 0.0))]
        ids.append(client.xadd(replay.trajectories_key(job_id), stream_fields(records)))
    return ids


def worker_argv(redis_url: str, job_id: int, tmp_path: Path, model_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, WORKER, "--redis-url", redis_url, "--job", str(job_id), "--model-dir", str(model_dir),
            "--checkpoint-dir", str(tmp_path / f"ckpt{job_id}"), "--ledger", str(tmp_path / f"ledger{job_id}"),
            "--max-steps", str(MAX_STEPS), "--kappa", "2", *extra]


def ledger(tmp_path: Path, job_id: int) -> list[dict]:
    path = tmp_path / f"ledger{job_id}"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def run(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    proc = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"worker timed out:\n{err[-3000:]}")
    return subprocess.CompletedProcess(argv, proc.returncode, out, err)


def test_killed_loop_resumes_without_losing_or_repeating_records(tmp_path, redis_url, redis_client,
                                                                   tiny_model_dir) -> None:
    env = dict(os.environ, OMP_NUM_THREADS="1", TOKENIZERS_PARALLELISM="false")
    ids = append_groups(redis_client, KILLED)
    key = replay.trajectories_key(KILLED)

    # --- first run: checkpoint v2 commits, update 3 is trained, then SIGKILL before its checkpoint
    proc = subprocess.Popen(worker_argv(redis_url, KILLED, tmp_path, tiny_model_dir, "--pause-after", "3"), env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not any(line["version"] == 3 for line in ledger(tmp_path, KILLED)):
            assert proc.poll() is None, proc.stderr.read().decode()[-3000:]
            assert time.monotonic() < deadline, "the worker never reached update 3"
            time.sleep(0.05)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
    first = ledger(tmp_path, KILLED)
    assert [line["version"] for line in first] == [1, 2, 3]
    left = set(entry_ids(redis_client, key))
    acknowledged = set(ids) - left
    assert acknowledged == set(first[0]["ids"] + first[1]["ids"])  # exactly what checkpoint v2 holds
    assert redis_client.xpending(key, replay.LEARNER_GROUP)["pending"] == 2  # update 3's groups, lost with it

    # --- restart: resumes at v2, trains update 3 again on the same groups, goes on to the end
    done = run(worker_argv(redis_url, KILLED, tmp_path, tiny_model_dir), env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.splitlines()[0]) == {"resumed_at": 2}
    second = [line for line in ledger(tmp_path, KILLED) if line["pid"] != first[0]["pid"]]
    assert [line["version"] for line in second] == [3, 4, 5, 6, 7]
    assert second[0]["ids"] == first[2]["ids"]

    lineage = [i for line in first[:2] + second for i in line["ids"]]  # the updates the final model contains
    assert len(lineage) == len(set(lineage)) == 2 * MAX_STEPS  # none trained twice
    assert lineage == ids[: 2 * MAX_STEPS]  # in stream order, none skipped
    assert entry_ids(redis_client, key) == ids[2 * MAX_STEPS:]  # the rest untouched
    assert redis_client.xpending(key, replay.LEARNER_GROUP)["pending"] == 0

    # --- an uninterrupted run over the same records takes the same updates
    append_groups(redis_client, CLEAN)
    clean = run(worker_argv(redis_url, CLEAN, tmp_path, tiny_model_dir), env)
    assert clean.returncode == 0, clean.stderr[-3000:]
    resumed = torch.load(tmp_path / f"ckpt{KILLED}" / "checkpoint.pt", weights_only=True)
    straight = torch.load(tmp_path / f"ckpt{CLEAN}" / "checkpoint.pt", weights_only=True)
    assert resumed["version"] == straight["version"] == MAX_STEPS
    base = load_file(Path(tiny_model_dir) / "model.safetensors")
    assert any(not torch.equal(straight["model"][k], base[k]) for k in base), "training changed nothing"
    for name, tensor in straight["model"].items():
        assert torch.equal(resumed["model"][name], tensor), name

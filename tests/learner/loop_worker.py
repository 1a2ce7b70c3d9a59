"""Run by test_resume.py as a subprocess: the learner's core loop against a real Redis, no site.

It resumes from ``--checkpoint-dir`` when a checkpoint is there, trains until ``--max-steps``, and
appends one JSON line per update to ``--ledger`` (version, the entry ids it trained, its pid) before
that update can be checkpointed. ``--pause-after N`` makes it stop dead after training update N and
before checkpointing it, so the test can SIGKILL it there.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import redis
import torch

from dataplane.jobs import JobSpec
from learner.checkpoint import CheckpointStore
from learner.consumer import StalenessGatedConsumer
from learner.loop import LearnerLoop
from learner.policy import build_policy


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--redis-url", required=True)
    parser.add_argument("--job", type=int, required=True)
    parser.add_argument("--model-dir", required=True)
    parser.add_argument("--checkpoint-dir", type=Path, required=True)
    parser.add_argument("--ledger", type=Path, required=True)
    parser.add_argument("--max-steps", type=int, required=True)
    parser.add_argument("--kappa", type=int, default=2)
    parser.add_argument("--pause-after", type=int, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    spec = JobSpec(name="resume", model_dir=args.model_dir, task={"name": "arithmetic"}, staleness=50,
                   kappa=args.kappa, batch_trajectories=4, group_size=2, max_steps=args.max_steps,
                   learning_rate=1e-2)
    trainer, _ = build_policy(spec, device="cpu")
    client = redis.Redis.from_url(args.redis_url, socket_timeout=30)
    consumer = StalenessGatedConsumer(client, args.job, spec.staleness)

    def on_trained(version: int, ids: list[str]) -> None:
        with open(args.ledger, "a") as f:
            f.write(json.dumps({"version": version, "ids": ids, "pid": os.getpid()}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        if version == args.pause_after:
            time.sleep(600)  # killed here: trained, not yet checkpointed

    loop = LearnerLoop(spec=spec, trainer=trainer, consumer=consumer, checkpoints=CheckpointStore(args.checkpoint_dir),
                       identity={"job_id": args.job, "created_at": "test"}, on_trained=on_trained)
    loop.resume()
    print(json.dumps({"resumed_at": loop.version}), flush=True)
    while loop.version < spec.max_steps:
        if loop.step(timeout_s=20) is None:
            print("no data", file=sys.stderr)
            return 3
    return 0


if __name__ == "__main__":
    sys.exit(main())

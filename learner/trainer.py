"""The learner's loop: wait for admissible groups, take a GRPO step, publish every kappa steps, report.

Reads top to bottom: setup, then per step: wait for data, step, acknowledge, publish, report.
"""

from __future__ import annotations

import collections
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import redis
import torch

from dataplane.jobs import JobSpec
from dataplane.tasks import build_task

from .batch import collate, token_logprobs
from .client import SiteClient, SiteError
from .consumer import StalenessGatedConsumer
from .grpo import clipped_surrogate_loss, group_advantages
from .prompts import PromptFeeder
from .publisher import SnapshotServer, SnapshotStore, manifest_json

log = logging.getLogger("echo2.learner")


@dataclass
class LearnerOptions:
    redis_url: str = "redis://127.0.0.1:6379/0"
    snapshot_dir: Path = Path("var/snapshots")
    snapshot_host: str = "127.0.0.1"
    snapshot_port: int = 0
    advertise_host: str | None = None
    data_timeout_s: float = 300.0
    device: str = "cpu"


@dataclass
class StepResult:
    loss: float
    reward_mean: float
    reward_std: float
    clip_fraction: float
    tokens: int


def grpo_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, records, *, pad_id: int,
              clip_eps: float, device: str) -> StepResult:
    """One optimizer step of GRPO on whole groups (token-level PPO-clip against behaviour log-probs)."""
    batch = collate(records, pad_id=pad_id)
    for name in ("input_ids", "attention", "token_mask", "behaviour_logp", "rewards", "group_index"):
        setattr(batch, name, getattr(batch, name).to(device))
    advantages = group_advantages(batch.rewards, batch.group_index)
    model.train()
    logp = token_logprobs(model, batch)
    terms = clipped_surrogate_loss(logp, batch.behaviour_logp, advantages, batch.token_mask, clip_eps=clip_eps)
    optimizer.zero_grad(set_to_none=True)
    terms.loss.backward()
    optimizer.step()
    return StepResult(loss=float(terms.loss.detach()), reward_mean=float(batch.rewards.mean()),
                      reward_std=float(batch.rewards.std(unbiased=False)), clip_fraction=terms.clip_fraction,
                      tokens=int(batch.token_mask.sum()))


def run_job(site: SiteClient, job_id: int, options: LearnerOptions) -> str:
    """Train job ``job_id`` to completion; returns the final status ('completed' or the reason it stopped)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    # --- setup: the job, the model, the streams, the snapshot server
    raw = site.job(job_id)
    if raw["status"] == "draft":
        raise SiteError(f"job {job_id} is a draft; start it first (POST /api/jobs/{job_id}/start/)")
    if raw["status"] != "running":
        raise SiteError(f"job {job_id} is {raw['status']}; only a running job can be trained")
    if raw["learner_step"] > 0:
        raise SiteError(f"job {job_id} already trained {raw['learner_step']} steps; resuming needs learner "
                        "checkpoints, which this version does not write yet")
    spec = JobSpec.model_validate(raw)
    torch.manual_seed(spec.seed)
    task = build_task(spec.task)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir).to(options.device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    client = redis.Redis.from_url(options.redis_url, socket_timeout=30)
    consumer = StalenessGatedConsumer(client, job_id, spec.staleness)
    feeder = PromptFeeder(client, job_id=job_id, task=task, seed=spec.seed, backlog=2 * spec.groups_per_step)
    store = SnapshotStore(options.snapshot_dir / f"job{job_id}", job_id=job_id, keep=spec.staleness + 2)
    server = SnapshotServer(store, host=options.snapshot_host, port=options.snapshot_port,
                            advertise_host=options.advertise_host).start()
    site.announce(job_id, t_train=None)
    feeder.top_up()
    log.info("job %s: %s on %s, S=%d kappa=%d R=%d n=%d; snapshots at %s", job_id, spec.task["name"],
             spec.model_dir, spec.staleness, spec.kappa, spec.batch_trajectories, spec.group_size,
             server.url_for(0))

    version = 0
    t_train_avg: float | None = None
    recent: collections.deque[float] = collections.deque(maxlen=10)
    try:
        while version < spec.max_steps:
            # --- wait for R admissible trajectories (whole groups), dropping stale ones
            feeder.top_up()
            wait = consumer.next_batch(groups=spec.groups_per_step, learner_version=version,
                                       timeout_s=options.data_timeout_s)
            if wait is None:
                reason = f"no admissible trajectories for {options.data_timeout_s:.0f}s"
                log.error("job %s: %s; failing the job", job_id, reason)
                site.finish(job_id, status="failed", reason=reason)
                return "failed"
            records = [r for g in wait.groups for r in g.records]

            # --- one GRPO step
            started = time.perf_counter()
            result = grpo_step(model, optimizer, records, pad_id=tokenizer.pad_token_id, clip_eps=spec.clip_eps,
                               device=options.device)
            t_train = time.perf_counter() - started
            lags = [version - r.version for r in records]
            consumer.ack(wait.groups)  # trained: these records are done
            version += 1

            # --- publish every kappa steps
            if version % spec.kappa == 0:
                manifest = store.write(model, version)
                site.publish(job_id, version=version, url=server.url_for(version), manifest=manifest_json(manifest))

            # --- report
            t_train_avg = t_train if t_train_avg is None else 0.9 * t_train_avg + 0.1 * t_train
            if version == 1 or version % 10 == 0:
                site.announce(job_id, t_train=t_train_avg)
            site.report(job_id, {
                "step": version, "reward_mean": result.reward_mean, "reward_std": result.reward_std,
                "loss": result.loss, "max_staleness": max(lags), "dropped_stale": consumer.dropped_total,
                "t_train": t_train, "wait_s": wait.wait_s,
                "extra": {"clip_fraction": result.clip_fraction, "tokens_per_s": result.tokens / max(t_train, 1e-9),
                          "staleness_histogram": dict(collections.Counter(lags)), "dropped_this_step": wait.dropped},
            })
            log.info("step %d reward=%.3f loss=%.4f max_lag=%d dropped=%d t_train=%.3fs wait=%.3fs", version,
                     result.reward_mean, result.loss, max(lags), consumer.dropped_total, t_train, wait.wait_s)
            recent.append(result.reward_mean)
            if spec.target_reward is not None and len(recent) == recent.maxlen and \
                    sum(recent) / len(recent) >= spec.target_reward:
                reason = f"10-step mean reward {sum(recent) / len(recent):.3f} reached the target {spec.target_reward}"
                log.info("job %s: %s at step %d", job_id, reason, version)
                site.finish(job_id, status="completed", reason=reason)
                return "completed"
        site.finish(job_id, status="completed", reason=f"reached {spec.max_steps} steps")
        return "completed"
    finally:
        server.stop()
        client.close()

"""The learner process: set up, then per step wait for data, train, checkpoint, publish every kappa, report.

Reads top to bottom. The core cycle (consume -> step -> checkpoint -> acknowledge) lives in
:class:`learner.loop.LearnerLoop`; this module adds the site (job, snapshots, metrics, status) and the
data-parallel ranks. Under ``torchrun`` every rank runs :func:`run_job`; rank 0 alone talks to the site
and Redis, the others follow its commands.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import logging
from typing import Any

import redis
import torch

from dataplane.jobs import TERMINAL, JobSpec, JobStatus, LossConfig
from dataplane.tasks import build_task

from . import distributed
from .checkpoint import CheckpointStore
from .client import SiteClient, SiteError
from .consumer import StalenessGatedConsumer
from .loop import LearnerLoop, ResumeError, StepOutcome, check_resume
from .prompts import PromptFeeder
from .publisher import LearnerRelay, SnapshotServer, SnapshotStore, manifest_json
from .settings import LearnerSettings
from .step import PolicyTrainer

log = logging.getLogger("echo2.learner")


def build_policy(spec: JobSpec, *, device: str, ctx: distributed.DistContext | None = None, micro_batch=None,
                 bf16: bool = False) -> tuple[PolicyTrainer, Any]:
    """Load the job's model (and, with a KL term, a frozen copy as reference); returns (trainer, tokenizer)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # the learner logs lines, not bars
    torch.manual_seed(spec.seed)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
    model = AutoModelForCausalLM.from_pretrained(spec.model_dir).to(device)
    reference = None
    if spec.loss.kl_beta > 0:
        reference = AutoModelForCausalLM.from_pretrained(spec.model_dir).to(device).eval().requires_grad_(False)
    optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
    trainer = PolicyTrainer(model, optimizer, spec.loss, pad_id=tokenizer.pad_token_id, reference=reference,
                            micro_batch=micro_batch, bf16=bf16, ctx=ctx or distributed.DistContext(device=device),
                            max_grad_norm=spec.loss.max_grad_norm)
    return trainer, tokenizer


def run_job(site: SiteClient, options: LearnerSettings) -> str:
    """Train job ``options.job`` to completion; returns the final status ('completed' or 'failed', or 'cancelled'
    when the owner cancelled it on the site). A paused job is waited for, not failed."""
    ctx = distributed.init(options.device, timeout_s=options.data_timeout_s + 900)
    job_id = options.job
    try:
        # --- setup: the job (rank 0 asks the site; every rank gets the answer or the error)
        raw: dict | str | None = None
        if ctx.is_main:
            try:
                raw = _runnable_job(site, job_id)
            except SiteError as err:
                raw = str(err)
        raw = distributed.broadcast(ctx, raw)
        if isinstance(raw, str):
            raise SiteError(raw)
        spec = JobSpec.model_validate(raw)
        if spec.batch_trajectories < ctx.world:
            raise SiteError(f"R={spec.batch_trajectories} trajectories cannot feed {ctx.world} ranks")
        trainer, _ = build_policy(spec, device=ctx.device, ctx=ctx, micro_batch=options.micro_batch,
                                  bf16=options.bf16)
        if not ctx.is_main:
            trainer.serve()  # until rank 0 releases us
            return distributed.broadcast(ctx, None)
        status = JobStatus.FAILED
        try:
            status = _lead(site, job_id, raw, spec, trainer, options, ctx)
        finally:
            trainer.release()
            distributed.broadcast(ctx, status)  # the other ranks return it too, even when rank 0 raised
        return status
    finally:
        distributed.shutdown(ctx)


def _runnable_job(site: SiteClient, job_id: int) -> dict:
    raw = site.job(job_id)
    if raw["status"] == JobStatus.DRAFT:
        raise SiteError(f"job {job_id} is a draft; start it first (POST /api/jobs/{job_id}/start/)")
    if raw["status"] not in (JobStatus.RUNNING, JobStatus.PAUSED):
        raise SiteError(f"job {job_id} is {raw['status']}; only a running (or paused) job can be trained")
    return raw


def _lead(site: SiteClient, job_id: int, raw: dict, spec: JobSpec, trainer: PolicyTrainer,
          options: LearnerSettings, ctx: distributed.DistContext) -> str:
    """Rank 0's part: streams, checkpoints, snapshots, and the loop with the site."""
    # --- setup: streams, checkpoints (resume), snapshot server
    client = redis.Redis.from_url(options.redis_url, socket_timeout=30, socket_connect_timeout=10)
    consumer = StalenessGatedConsumer(client, job_id, spec.staleness)
    task = build_task(spec.task)
    feeder = PromptFeeder(client, job_id=job_id, task=task, seed=spec.seed, backlog=2 * spec.groups_per_step)
    checkpoints = CheckpointStore(options.checkpoint_dir or options.snapshot_dir / f"job{job_id}-checkpoint")
    identity = {"job_id": job_id, "created_at": raw.get("created_at"), "model_dir": spec.model_dir}
    loop = LearnerLoop(spec=spec, trainer=trainer, consumer=consumer, checkpoints=checkpoints, identity=identity,
                       checkpoint_every=options.checkpoint_every, feeder=feeder)
    try:
        ckpt = loop.resume()
        check_resume(job_id, learner_step=raw.get("learner_step", 0), published_version=raw.get("published_version", 0),
                     checkpoint_version=ckpt.version if ckpt else None, path=checkpoints.path)
    except ResumeError as err:
        raise SiteError(str(err)) from None
    checkpoints.save_config(_resolved_config(spec, trainer, options, ctx))
    store = SnapshotStore(options.snapshot_dir / f"job{job_id}", job_id=job_id, keep=spec.staleness + 2)
    server = SnapshotServer(store, host=options.snapshot_host, port=options.snapshot_port,
                            advertise_host=options.advertise_host).start()
    relay = None
    if options.relay and spec.broadcast_strategy == "chain":
        relay = LearnerRelay(store, uplink_bps=spec.learner_uplink_bps, host=options.snapshot_host,
                             port=options.relay_port, advertise_host=options.advertise_host)
    try:
        site.announce(job_id, t_train=loop.t_train_avg, relay_address=relay.address if relay else "")
        feeder.top_up()
        log.info("job %s: %s on %s, S=%d kappa=%d R=%d n=%d, loss %s, %d rank(s); snapshots at %s; %s", job_id,
                 spec.task["name"], spec.model_dir, spec.staleness, spec.kappa, spec.batch_trajectories,
                 spec.group_size, _loss_line(spec.loss) + f" max_grad_norm={trainer.max_grad_norm}", ctx.world,
                 server.url_for(0) + (f" and relay {relay.address}" if relay else ""),
                 f"resumed at v{loop.version}" if ckpt else "fresh start")
        if ckpt is not None and loop.version % spec.kappa == 0 and raw.get("published_version", 0) < loop.version:
            # crashed between checkpoint and publish
            _publish(site, job_id, store, server, relay, trainer, loop.version)

        idle_s, waited_s, paused = 0.0, 0.0, False
        while loop.version < spec.max_steps:
            # --- wait for R admissible records (whole groups), dropping stale ones; train; checkpoint when due.
            # Waits are cut into polls so a pause, resume or cancel on the site is seen within a poll.
            poll_s = min(options.data_timeout_s, options.status_poll_s)
            try:
                outcome = loop.step(timeout_s=poll_s)
            except redis.RedisError as err:
                stopped = _ended_on_site(site, job_id, loop)  # cancelled: the site dropped the streams
                if stopped:
                    return stopped
                return _fail(site, job_id, f"Redis failed: {type(err).__name__}: {err}")
            if outcome is None:
                status = _site_status(site, job_id)
                if status in TERMINAL:
                    return _ended_on_site(site, job_id, loop, status)
                if status == JobStatus.PAUSED:
                    if not paused:
                        log.info("job %s paused: waiting for it to resume (v%d)", job_id, loop.version)
                    paused, idle_s = True, 0.0
                    continue
                if paused:
                    log.info("job %s resumed", job_id)
                paused = False
                idle_s += poll_s
                waited_s += poll_s
                if idle_s >= options.data_timeout_s:
                    _commit_pending(loop)
                    return _fail(site, job_id, f"no admissible trajectories for {idle_s:.0f}s "
                                               f"(waiting for {spec.groups_per_step} groups at v{loop.version})")
                continue
            # The bubble counts the whole wait while running (earlier polls too), not time spent paused.
            outcome = dataclasses.replace(outcome, wait_s=outcome.wait_s + waited_s)
            idle_s = waited_s = 0.0

            # --- publish every kappa steps (the checkpoint of this version is already committed)
            if outcome.version % spec.kappa == 0:
                try:
                    _publish(site, job_id, store, server, relay, trainer, outcome.version)
                except SiteError as err:
                    return _fail(site, job_id, f"publishing v{outcome.version} failed: {err}")

            # --- report
            try:
                _report(site, job_id, loop, outcome, ctx)
            except SiteError as err:
                stopped = _ended_on_site(site, job_id, loop)  # cancelled meanwhile: not a failure of ours
                if stopped:
                    return stopped
                return _fail(site, job_id, f"reporting step {outcome.version} failed: {err}")
            reached = loop.reward_target_reached()
            if reached is not None:
                _commit_pending(loop)
                reason = f"10-step mean reward {reached:.3f} reached the target {spec.target_reward}"
                log.info("job %s: %s at step %d", job_id, reason, loop.version)
                site.finish(job_id, status=JobStatus.COMPLETED, reason=reason)
                return JobStatus.COMPLETED
        site.finish(job_id, status=JobStatus.COMPLETED, reason=f"reached {spec.max_steps} steps")
        return JobStatus.COMPLETED
    finally:
        server.stop()
        if relay is not None:
            relay.stop()
        client.close()


def _publish(site: SiteClient, job_id: int, store: SnapshotStore, server: SnapshotServer, relay: LearnerRelay | None,
             trainer: PolicyTrainer, version: int) -> None:
    manifest = store.write(trainer.module, version)
    if relay is not None:  # before the site tells the seeds to connect
        relay.serve(version)
    reply = site.publish(job_id, version=version, url=server.url_for(version), manifest=manifest_json(manifest))
    n_chains = (reply or {}).get("n_chains") or 0
    if relay is not None and n_chains:
        relay.set_fan_out(version, n_chains)
    log.info("published v%d (%d bytes)%s", version, manifest.total_bytes,
             f" to {n_chains} chain(s)" if n_chains else " over HTTP")


def _report(site: SiteClient, job_id: int, loop: LearnerLoop, outcome: StepOutcome,
            ctx: distributed.DistContext) -> None:
    result, version = outcome.result, outcome.version
    if version == 1 or version % 10 == 0:
        site.announce(job_id, t_train=loop.t_train_avg)
    histogram = collections.Counter(outcome.lags)
    site.report(job_id, {
        "step": version, "reward_mean": result.reward_mean, "reward_std": result.reward_std, "loss": result.loss,
        "max_staleness": max(outcome.lags), "dropped_stale": loop.consumer.dropped_total,
        "t_train": outcome.t_train, "wait_s": outcome.wait_s,
        "extra": {
            **result.metrics(), "tokens": result.tokens, "tokens_per_s": result.tokens / max(outcome.t_train, 1e-9),
            "staleness_histogram": {str(lag): histogram[lag] for lag in sorted(histogram)},
            "dropped_this_step": outcome.dropped, "bubble": outcome.wait_s / max(outcome.wait_s + outcome.t_train,
                                                                                   1e-9),
            "checkpointed": outcome.checkpointed, "ranks": ctx.world,
        },
    })
    m = result.metrics()
    log.info("step %d reward=%.3f loss=%.4f kl=%.4f clip=%.3f |g|=%.3f max_lag=%d dropped=%d t_train=%.3fs "
             "wait=%.3fs%s", version, result.reward_mean, result.loss, m["kl"], m["clip_fraction"], result.grad_norm,
             max(outcome.lags),
             loop.consumer.dropped_total, outcome.t_train, outcome.wait_s, " (checkpoint)" if outcome.checkpointed
             else "")


def _commit_pending(loop: LearnerLoop) -> None:
    if loop.uncommitted:
        loop.commit()


def _site_status(site: SiteClient, job_id: int) -> str | None:
    """The job's status on the site, or None when the site does not answer (the caller carries on)."""
    try:
        return site.job(job_id)["status"]
    except SiteError as err:
        log.warning("job %s: could not read its status from the site: %s", job_id, err)
        return None


def _ended_on_site(site: SiteClient, job_id: int, loop: LearnerLoop, status: str | None = None) -> str | None:
    """When the job has ended on the site (cancelled, say), commit what was trained and return its status."""
    status = status or _site_status(site, job_id)
    if status not in TERMINAL:
        return None
    _commit_pending(loop)
    log.info("job %s was %s on the site; stopping at v%d", job_id, status, loop.version)
    return status


def _fail(site: SiteClient, job_id: int, reason: str) -> str:
    """Log ``reason``, mark the job failed on the site (if it answers), and return 'failed'."""
    log.error("job %s: %s; failing the job", job_id, reason)
    try:
        site.finish(job_id, status=JobStatus.FAILED, reason=reason)
    except SiteError as err:
        log.error("job %s: could not tell the site it failed: %s", job_id, err)
    return JobStatus.FAILED


def _loss_line(s: LossConfig) -> str:
    return (f"{s.type}/{s.aggregation}/{s.off_policy} eps=({s.clip_eps_low},{s.clip_eps_high}) beta={s.kl_beta}"
            + (f" C={s.is_cap}" if s.off_policy in ("tis", "mis") else ""))


def _resolved_config(spec: JobSpec, trainer: PolicyTrainer, options: LearnerSettings,
                     ctx: distributed.DistContext) -> dict[str, Any]:
    """What this run trains with, every default filled in (saved beside the checkpoint; no secrets)."""
    learner = {**options.saved(), "world_size": ctx.world}
    return json.loads(json.dumps({"job": spec.model_dump(mode="json"), "loss": trainer.loss.model_dump(mode="json"),
                                  "learner": learner}, default=str))

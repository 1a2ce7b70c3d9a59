"""The learner process: set up, then per step wait for data, train, checkpoint, publish every kappa, report.

Reads top to bottom in :func:`run_job` and :func:`_train_job`. The core cycle (consume -> step ->
checkpoint -> acknowledge) lives in :class:`learner.loop.LearnerLoop`; pause, idle and failure are the
state machine of :mod:`learner.lifecycle`; what is published and when, the :class:`~learner.publication.Publisher`;
this module adds the site (job, metrics, status) and the data-parallel ranks. Under ``torchrun`` every rank
runs :func:`run_job`; rank 0 alone talks to the site and Redis, the others follow its commands.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import hashlib
import json
import logging
import time
from collections.abc import Iterator
from typing import Any

import torch

from dataplane import audit_hold, replay
from dataplane.chat import PromptFormatError, check_tokenizer, prompt_ids
from dataplane.jobs import JobSpec, JobStatus, LossConfig, model_dir_problem
from dataplane.tasks import build_task
from dataplane.timing import step_split

from . import datasets, distributed
from .audit import Auditor, AuditSettings, snapshot_weights
from .audit_probation import restore_probation
from .checkpoint import Checkpoint, CheckpointStore
from .client import Heartbeat, SiteClient, SiteError
from .consumer import StalenessGatedConsumer
from .evaluation import Evaluation
from .explog import ExperimentLog, experiment_log
from .lifecycle import Lifecycle, State
from .loop import LearnerLoop, ResumeError, StepOutcome, check_resume
from .outbox import Outbox
from .policy import build_policy, load_model
from .prompts import PromptFeeder
from .publication import Publisher, PublishError
from .quarantine import model_vocab_size
from .report import log_step, step_metrics
from .scoring import OwnerScoring
from .settings import LearnerSettings, redis_location
from .snapshots import SnapshotStore
from .step import PolicyTrainer

log = logging.getLogger("echo2.learner")


def run_job(site: SiteClient, settings: LearnerSettings) -> JobStatus:
    """Train job ``settings.job`` to completion; returns the final status (completed or failed, or the
    site's when it ended the job: cancelled, say). A paused job is waited for, not failed."""
    ctx = distributed.init(settings.device, timeout_s=settings.data_timeout_s + 900)
    try:
        # --- set up: the job (rank 0 asks the site; every rank gets the answer or the error) and the policy
        raw, spec = _job_on_every_rank(site, settings.job, ctx)
        trainer, tokenizer = build_policy(spec, device=ctx.device, ctx=ctx, micro_batch=settings.micro_batch,
                                          bf16=settings.bf16, parallel=settings.parallel,
                                          activation_checkpointing=settings.activation_checkpointing)
        try:  # a job whose prompts the model's tokenizer cannot build fails now, with the reason
            check_tokenizer(tokenizer, spec.prompt_format)
        except PromptFormatError as err:
            return _fail(site, settings.job, str(err)) if ctx.is_main else JobStatus.FAILED
        if not ctx.is_main:
            trainer.serve()  # until rank 0 releases us
            return distributed.broadcast(ctx, None)
        status = JobStatus.FAILED
        try:
            status = _train_job(site, settings, raw, spec, trainer, ctx)
        finally:
            trainer.release()
            distributed.broadcast(ctx, status)  # the other ranks return it too, even when rank 0 raised
        return status
    finally:
        distributed.shutdown(ctx)


def _train_job(site: SiteClient, settings: LearnerSettings, raw: dict, spec: JobSpec, trainer: PolicyTrainer,
               ctx: distributed.DistContext) -> JobStatus:
    """Rank 0: set up, then step until the lifecycle is final; each stage is a no-op once it is."""
    with _JobRun.set_up(site, settings, raw, spec, trainer, ctx) as run:
        # --- the owner's reward functions on a few real rows before step 1: a job that cannot score stops now
        problem = run.loop.scoring.preflight() if run.loop.scoring is not None and run.loop.version == 0 else ""
        if problem:
            return _fail(site, settings.job, problem)
        life = Lifecycle(data_timeout_s=settings.data_timeout_s)
        if run.loop.version == 0:  # --- the base model on the held-out problems, when the job's eval asks
            run.evaluate(0)
        while not life.final:
            if run.loop.version >= spec.max_steps:
                life.complete(f"reached {spec.max_steps} steps")
                break
            # --- wait for R admissible records (whole groups), dropping stale ones; train; checkpoint when due
            outcome = run.wait_and_train(life)
            if outcome is None:
                continue
            # --- publish every kappa steps (the checkpoint of this version is already committed)
            run.publish_due(life, outcome.version)
            # --- report the step's metrics to the site
            run.report(life, outcome)
            # --- complete early once the 10-step mean reward reaches the target
            run.check_target(life)
        return run.conclude(life)


def _job_on_every_rank(site: SiteClient, job_id: int, ctx: distributed.DistContext) -> tuple[dict, JobSpec]:
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
    problem = model_dir_problem(spec.model_dir)
    if problem:  # before transformers, whose error for a missing path is about the hub
        raise SiteError(f"model_dir: {problem}")
    if spec.batch_trajectories < ctx.world:
        raise SiteError(f"R={spec.batch_trajectories} trajectories cannot feed {ctx.world} ranks")
    return raw, spec


def _runnable_job(site: SiteClient, job_id: int) -> dict:
    raw = site.job(job_id)
    if raw["status"] == JobStatus.DRAFT:
        raise SiteError(f"job {job_id} is a draft; start it first (POST /api/jobs/{job_id}/start/)")
    if raw["status"] not in (JobStatus.RUNNING, JobStatus.PAUSED, JobStatus.STALLED):  # stalled: we are back
        raise SiteError(f"job {job_id} is {raw['status']}; only a running (or paused) job can be trained")
    return raw


def _streams_url(site: SiteClient, settings: LearnerSettings) -> str:
    """The Redis URL of the job's streams: ``--redis`` when given (a single-machine setup), else the door the site
    opens for this learner session (its own Redis user; a learner of the job still running is cut off)."""
    if settings.redis_url:
        log.info("job %s: streams at %s (--redis)", settings.job, redis_location(settings.redis_url))
        return settings.redis_url
    door = site.streams(settings.job)
    where = redis_location(door["url"])
    if door.get("isolated"):
        log.info("job %s: streams at %s as %s (its job's keys alone)", settings.job, where, door.get("username"))
    else:
        log.warning("job %s: streams at %s with the site's own rights, not a user of the job's own: %s",
                    settings.job, where, door.get("reason") or "the site did not say why")
    return door["url"]


def _streams(client: replay.Client, job_id: int, spec: JobSpec, retry_for_s: float,
             vocab_size: int | None) -> tuple[StalenessGatedConsumer, PromptFeeder]:
    """The job's trajectory reader (the staleness gate, quarantining what the model must not see: the task's
    limits and the model's ``vocab_size``) and prompt writer, both riding out Redis restarts."""
    task = build_task(spec.task)
    task.prepare(allow_user_code=True)  # the owner's machine runs the job's code (a verifiers environment's prompts)
    limits = task.record_limits(max_new_tokens=spec.max_new_tokens, vocab_size=vocab_size)
    limits = dataclasses.replace(limits, prompt_extra_tokens=spec.prompt_format.token_allowance())
    consumer = StalenessGatedConsumer(client, job_id, spec.staleness, retry_for_s=retry_for_s, limits=limits,
                                      prefetch=True)
    feeder = PromptFeeder(client, job_id=job_id, task=task, seed=spec.seed, backlog=2 * spec.groups_per_step,
                          retry_for_s=retry_for_s, background=True)
    return consumer, feeder


@dataclasses.dataclass
class _JobRun:
    """Rank 0's job: the site, the core loop and its publications (learner/publication.py); one method per stage."""

    site: SiteClient
    settings: LearnerSettings
    spec: JobSpec
    loop: LearnerLoop
    publisher: Publisher
    ctx: distributed.DistContext
    explog: ExperimentLog
    report_started: float = dataclasses.field(default_factory=time.perf_counter)  # the step wall clock (timing.py)
    last_report_s: float = 0.0
    evaluation: Evaluation | None = None  # the job's eval (learner/evaluation.py); None: off
    evals: list[dict] = dataclasses.field(default_factory=list)  # results not yet in a step report

    @property
    def outbox(self) -> Outbox:
        """The queue to the site (the publisher's): step reports and T_train go through it too, in order."""
        return self.publisher.outbox

    @property
    def job_id(self) -> int:
        return self.settings.job

    @classmethod
    @contextlib.contextmanager
    def set_up(cls, site: SiteClient, settings: LearnerSettings, raw: dict, spec: JobSpec, trainer: PolicyTrainer,
               ctx: distributed.DistContext) -> Iterator[_JobRun]:
        """Streams, checkpoint (resume), snapshot server and relay, announced to the site; all closed on exit."""
        job_id = settings.job
        with contextlib.ExitStack() as stack:
            client = replay.connect(_streams_url(site, settings), decode_responses=False, socket_timeout=30,
                                    ca_file=str(settings.redis_ca) if settings.redis_ca else None)
            stack.callback(client.close)
            datasets.provide(build_task(spec.task), root=settings.snapshot_dir / f"job{job_id}", job_id=job_id,
                             dataset=settings.dataset, site=site)  # before a prompt is sampled: the rows are there
            consumer, feeder = _streams(client, job_id, spec, settings.redis_retry_s, model_vocab_size(trainer.module))
            checkpoints = CheckpointStore(settings.checkpoint_dir or settings.snapshot_dir / f"job{job_id}-checkpoint")
            identity = {"job_id": job_id, "created_at": raw.get("created_at"), "model_dir": spec.model_dir}
            loop = LearnerLoop(spec=spec, trainer=trainer, consumer=consumer, checkpoints=checkpoints,
                               identity=identity, checkpoint_every=settings.checkpoint_every, feeder=feeder,
                               background=True,  # checkpoints and snapshots written while the next step trains
                               samples_every=settings.samples_every, samples_per_step=settings.samples_per_step,
                               scoring=_owner_scoring(spec, stack))
            stack.callback(loop.close)
            ckpt = _resume(loop, raw, job_id)
            resolved = _resolved_config(spec, settings, ctx)
            checkpoints.save_config(resolved)
            explog = _experiment_log(settings, raw, resolved)
            stack.callback(explog.close)
            publisher = stack.enter_context(Publisher.opened(site, settings, spec, loop))
            consumer.audit = _auditor(spec, settings, trainer, publisher.store)
            _audit_ready(consumer, client, job_id, ckpt)
            heartbeat = Heartbeat(settings.server, settings.token, job_id, interval_s=settings.heartbeat_s,
                                  timeout=settings.site_timeout_s).start()
            stack.callback(heartbeat.stop)
            run = cls(site, settings, spec, loop, publisher, ctx, explog, evaluation=_evaluation(spec, trainer))
            run.announce(resumed=ckpt is not None)
            publisher.publish_base(raw.get("base_digest") or "")
            if ckpt is not None:
                publisher.publish_resumed(raw.get("published_version", 0))
                publisher.outbox.resend(ckpt.state, raw.get("learner_step", 0))
            publisher.outbox.start()  # from now on reports and publications leave from a thread of their own
            log.info("job %s: %s, set up; training", job_id, f"resumed at v{loop.version}" if ckpt else "fresh start")
            yield run

    def announce(self, *, resumed: bool) -> None:
        """Tell the site the learner is up (and where its relay is), queue prompts, log the run's shape."""
        spec, loop, publisher = self.spec, self.loop, self.publisher
        reply = self.site.announce(self.job_id, t_train=loop.t_train, relay_address=publisher.relay_address,
                                   vocab_size=loop.consumer.quarantine.limits.vocab_size)
        # The reply alone carries the job's transfer secret: from now on both doors admit credential holders.
        secret = (reply or {}).get("transfer_secret")
        if not secret:
            log.warning("job %s: the site sent no transfer secret; every worker will be refused", self.job_id)
        publisher.set_secret(secret)
        if loop.feeder is not None:
            loop.feeder.top_up()
        log.info("job %s: %s on %s, S=%d kappa=%d R=%d n=%d, loss %s, %d rank(s)%s; snapshots at %s; from %s",
                 self.job_id, spec.task["name"], spec.model_dir, spec.staleness, spec.kappa, spec.batch_trajectories,
                 spec.group_size, _loss_line(spec.loss) + f" max_grad_norm={loop.trainer.max_grad_norm}",
                 self.ctx.world, " sharded (FSDP)" if loop.trainer.sharded else "",
                 publisher.doors,
                 f"its checkpoint v{loop.version}" if resumed else "the base model")

    def wait_and_train(self, life: Lifecycle) -> StepOutcome | None:
        """One poll for data (a short wait, so a pause, resume or cancel on the site is seen within it): the
        step it trained, its bubble counting the earlier polls while running, or None (see ``life``)."""
        poll_s = min(self.settings.data_timeout_s, self.settings.status_poll_s)
        try:
            outcome = self.loop.step(timeout_s=poll_s, report=lambda o: step_metrics(self.loop, o, self.ctx),
                                     unsent=self.outbox.queued_reports)
        except replay.RedisError as err:  # cancelled: the site dropped the streams
            life.redis_failed(self.site_status(), f"{type(err).__name__}: {err}")
            return None
        if outcome is None:
            before = life.state
            life.no_data(self.site_status(), poll_s, waiting_for=f" (waiting for {self.spec.groups_per_step} groups "
                                                                 f"at v{self.loop.version})")
            if life.state is State.PAUSED and before is not State.PAUSED:
                log.info("job %s paused: waiting for it to resume (v%d)", self.job_id, self.loop.version)
            elif before is State.PAUSED and life.state is not State.PAUSED:
                log.info("job %s resumed", self.job_id)
            return None
        return dataclasses.replace(outcome, wait_s=outcome.wait_s + life.trained())

    def publish_due(self, life: Lifecycle, version: int) -> None:
        try:
            self.publisher.publish_due(version)
        except PublishError as err:  # this version's, or an earlier one's met by the committer's thread
            life.publish_failed(err.version, str(err))

    def evaluate(self, version: int) -> float:
        """Score the policy at ``version`` on the held-out problems when the job's eval says so (its result goes
        into the next step report and the experiment logs at ``version``); returns the seconds it took."""
        if self.evaluation is None or not self.evaluation.due(version):
            return 0.0
        result = self.evaluation.run(self.loop.trainer.module, version)
        self.evals.append(result)
        self.explog.log(version, {"eval": [result]})
        return result["seconds"]

    def report(self, life: Lifecycle, outcome: StepOutcome) -> None:
        t_eval = self.evaluate(outcome.version)
        now = time.perf_counter()
        outcome.timing = step_split(now - self.report_started, wait=outcome.wait_s, train=outcome.t_train,
                                    checkpoint=outcome.t_checkpoint, publish=self.publisher.seconds,
                                    report=self.last_report_s, eval=t_eval)
        self.report_started = now
        try:
            self._report(life, outcome)
        finally:
            self.last_report_s = time.perf_counter() - now

    def _report(self, life: Lifecycle, outcome: StepOutcome) -> None:
        if life.final:
            return
        try:
            if outcome.version == 1 or outcome.version % 10 == 0:
                self.outbox.announce(self.loop.t_train)  # T_train again, from the outbox's thread
            log_step(self.loop, outcome)
            metrics = step_metrics(self.loop, outcome, self.ctx)
            if self.evals:  # the evaluations since the last report (the base's rides on step 1's)
                metrics["extra"]["eval"], self.evals = self.evals, []
            self.explog.log(outcome.version, metrics)  # TensorBoard, W&B: a queue append, never a failure
            self.outbox.report(metrics)  # queued while the site is down
            if outcome.scores is not None and outcome.scores.pause_reason:
                self.pause_for(outcome.scores.pause_reason)
        except SiteError as err:  # a refusal; cancelled meanwhile is not a failure of ours
            life.report_failed(self.site_status(), outcome.version, str(err))

    def check_target(self, life: Lifecycle) -> None:
        reached = None if life.final else self.loop.reward_target_reached()
        if reached is not None:
            life.complete(f"10-step mean reward {reached:.3f} reached the target {self.spec.target_reward}")
            log.info("job %s: %s at step %d", self.job_id, life.reason, self.loop.version)

    def conclude(self, life: Lifecycle) -> JobStatus:
        """Commit what was trained (unless Redis or the site failed us), tell the site, return the status."""
        assert life.final and life.status is not None
        if life.commit and self.loop.uncommitted:
            self.loop.commit()
        self.loop.settle(acknowledge=life.commit)  # what the committer was handed is on disk before the job ends
        if life.state is State.COMPLETED:
            self.publisher.publish_final()
        try:
            drained = self.outbox.drain(within_s=self.settings.site_outage_s)
        except SiteError as err:  # a report refused at the very end: the job's outcome stands
            log.error("job %s: the site refused a report: %s", self.job_id, err)
            drained = True
        if not drained:
            log.error("job %s: the site did not answer for %.0f s; %d reports were not delivered", self.job_id,
                      self.settings.site_outage_s, self.outbox.pending)
        if life.state is State.ENDED:
            log.info("job %s was %s on the site; stopping at v%d", self.job_id, life.status, self.loop.version)
        elif life.state is State.FAILED:
            _fail(self.site, self.job_id, life.reason)
        else:
            self.site.finish(self.job_id, status=JobStatus.COMPLETED, reason=life.reason)
        return life.status

    def pause_for(self, reason: str) -> None:
        """Pause the job on the site with ``reason`` (the owner's functions fail too often); it runs again when the
        owner resumes it."""
        log.error("job %s: %s; pausing the job", self.job_id, reason)
        try:
            self.site.pause(self.job_id, reason=reason)
        except SiteError as err:  # paused or ended meanwhile
            log.warning("job %s: could not pause it: %s", self.job_id, err)
        if self.loop.scoring is not None:
            self.loop.scoring.recent.clear()  # a resumed job is judged on records scored after it

    def site_status(self) -> str | None:
        """The job's status on the site, or None when the site does not answer (the caller carries on)."""
        try:
            return self.site.job(self.job_id)["status"]
        except SiteError as err:
            log.warning("job %s: could not read its status from the site: %s", self.job_id, err)
            return None


def _resume(loop: LearnerLoop, raw: dict, job_id: int) -> Checkpoint | None:
    """Continue from the checkpoint, if any, when the site agrees with it (``check_resume``)."""
    try:
        ckpt = loop.resume()
        check_resume(job_id, reported_version=raw.get("learner_step", 0),
                     published_version=raw.get("published_version", 0),
                     checkpoint_version=ckpt.version if ckpt else None, path=loop.checkpoints.path)
    except ResumeError as err:
        raise SiteError(str(err)) from None
    return ckpt


def _audit_ready(consumer: StalenessGatedConsumer, client, job_id: int, ckpt: Checkpoint | None) -> None:
    """The auditor's state beyond its settings: failed entries copied aside for the site's check
    (dataplane.audit_hold), and the workers' probation as the checkpoint kept it (a restarted learner does not
    treat every worker as new, nor forget which failed)."""
    if consumer.audit is None:
        return
    consumer.audit.hold = functools.partial(audit_hold.hold, client, job_id)
    if ckpt is not None:
        restore_probation(consumer.audit, ckpt.state.get("audit_probation"), audit_hold.held_workers(client, job_id))


def _auditor(spec: JobSpec, settings: LearnerSettings, trainer: PolicyTrainer, store: SnapshotStore) -> Auditor | None:
    """The audits of the workers' records (learner/audit.py) on a frozen scoring copy of the policy."""
    if settings.audit_fraction <= 0:
        return None
    from transformers import AutoTokenizer

    scorer = _plain_copy(trainer, spec).eval().requires_grad_(False)
    tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)  # texts checked against ids as the engines decode
    task = build_task(spec.task)
    # The audit recomputes rewards with the same code the workers ran, user functions included: the learner is the
    # job owner's own machine, so it runs the owner's code (docs/trust.md, "User code on workers").
    task.prepare(allow_user_code=True)
    return Auditor(scorer, pad_id=trainer.pad_id, task=task,
                   weights=snapshot_weights(store.root, spec.model_dir),
                   decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
                   encode=lambda prompt: prompt_ids(tokenizer, prompt, spec.prompt_format),
                   settings=AuditSettings(fraction=settings.audit_fraction, probation_groups=settings.audit_probation,
                                          logprob_tolerance=settings.audit_logprob_tolerance,
                                          logprob_nats=settings.audit_logprob_nats,
                                          logprob_tail_nats=settings.audit_logprob_tail_nats,
                                          logprob_floor=settings.audit_logprob_floor,
                                          logprob_share=settings.audit_logprob_share))


def _evaluation(spec: JobSpec, trainer: PolicyTrainer) -> Evaluation | None:
    """The job's evaluation on rank 0's policy (learner/evaluation.py), None when its eval is off or the policy is
    sharded (rank 0 alone cannot run a sharded model)."""
    if not spec.eval.enabled:
        return None
    if trainer.sharded:
        log.warning("job eval: the policy is sharded with FSDP; the learner does not evaluate it")
        return None
    from transformers import AutoTokenizer

    return Evaluation.for_job(spec, AutoTokenizer.from_pretrained(spec.model_dir))


def _plain_copy(trainer: PolicyTrainer, spec: JobSpec) -> torch.nn.Module:
    """An unsharded copy of the policy's architecture for rank 0 alone (the auditor loads each version's
    weights into it): a deep copy, or for a sharded policy the base model again (a whole model in memory)."""
    if not trainer.sharded:
        return copy.deepcopy(trainer.module)
    return load_model(spec.model_dir).to(trainer.ctx.device)


def _owner_scoring(spec: JobSpec, stack: contextlib.ExitStack) -> OwnerScoring | None:
    """The pool scoring the owner's reward functions here (learner/scoring.py); None when the workers score all."""
    scoring = OwnerScoring.for_job(spec.task, chat=spec.prompt_format, max_steps=spec.max_steps)
    if scoring is not None:
        stack.callback(scoring.close)
    return scoring


def _fail(site: SiteClient, job_id: int, reason: str) -> JobStatus:
    """Log ``reason``, mark the job failed on the site (if it answers), and return failed."""
    log.error("job %s: %s; failing the job", job_id, reason)
    try:
        site.finish(job_id, status=JobStatus.FAILED, reason=reason)
    except SiteError as err:
        log.error("job %s: could not tell the site it failed: %s", job_id, err)
    return JobStatus.FAILED


def _loss_line(s: LossConfig) -> str:
    return (f"{s.type}/{s.aggregation}/{s.off_policy} eps=({s.clip_eps_low},{s.clip_eps_high}) beta={s.kl_beta}"
            + (f" C={s.is_cap}" if s.off_policy in ("tis", "mis") else ""))


def _experiment_log(settings: LearnerSettings, raw: dict, resolved: dict[str, Any]) -> ExperimentLog:
    """TensorBoard and W&B (learner/explog.py). The W&B run id is the job's (its id and creation time), so a
    restarted learner continues the same run."""
    job_id = settings.job
    run_id = f"job{job_id}-" + hashlib.sha256(f"{job_id}/{raw.get('created_at')}".encode()).hexdigest()[:12]
    tags = [tag.strip() for tag in (settings.wandb_tags or "").split(",") if tag.strip()]
    return experiment_log(job_id=job_id, run_id=run_id, logdir=settings.logdir if settings.tensorboard else None,
                          wandb_project=settings.wandb_project, config=resolved, wandb_name=settings.wandb_name,
                          wandb_tags=tags)


def _resolved_config(spec: JobSpec, settings: LearnerSettings, ctx: distributed.DistContext) -> dict[str, Any]:
    """What this run trains with, every default filled in (saved beside the checkpoint; no secrets)."""
    return json.loads(json.dumps({"job": spec.model_dump(mode="json"), "loss": spec.loss.model_dump(mode="json"),
                                  "learner": {**settings.saved(), "world_size": ctx.world}}, default=str))

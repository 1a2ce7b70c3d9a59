"""The learner's core cycle, with no site in it: wait for data -> step -> checkpoint -> acknowledge.

``run_job`` (learner/trainer.py) wraps it with what the site needs (publication, metrics); tests run it
alone against a real Redis, kill it and restart it.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dataplane import samples
from dataplane.jobs import JobSpec
from dataplane.replay import DROPPED_STALE, RedisError
from dataplane.timing import T_TRAIN_STEPS
from dataplane.timing import t_train as t_train_of

from . import diskroom
from .audit_probation import probation_state
from .batch import concat
from .checkpoint import Checkpoint, CheckpointStore, Committer, capture_rng, restore_rng
from .consumer import StalenessGatedConsumer
from .prompts import PromptFeeder
from .step import PolicyTrainer, StepResult

log = logging.getLogger("echo2.learner")


class ResumeError(RuntimeError):
    """The checkpoint on disk cannot continue this job; ``str(err)`` says why and what to do."""


@dataclass
class StepOutcome:
    version: int  # v_t after the update
    result: StepResult
    entry_ids: list[str]
    lags: list[int]  # v_t - v of every trained record, v_t taken before the update
    wait_s: float  # time spent waiting for admissible data (the learner's bubble)
    dropped: int  # records dropped as stale while waiting
    t_train: float
    checkpointed: bool
    quarantined: int = 0  # records quarantined while waiting (learner/quarantine.py)
    t_checkpoint: float = 0.0  # checkpointing on this thread: writing it (or copying it for the committer), waiting
    timing: dict[str, float] | None = None  # the step's wall time split (dataplane/timing.py), set when reported
    samples: list[dict] = field(default_factory=list)  # a few trained records, every ``samples_every`` steps
    scores: Any = None  # the owner's functions scored on the learner (learner/scoring.py BatchScores), or None
    lengths: dict[str, float] = field(default_factory=dict)  # completion tokens: mean, max, clipped share


def check_resume(job_id: int, *, reported_version: int, published_version: int, checkpoint_version: int | None,
                 path: Path) -> None:
    """Refuse to train when the site and the checkpoint disagree in a way no restart can repair.

    A job that trained steps needs its checkpoint (or it would restart from the base model under version
    numbers agents already hold); a published snapshot newer than the checkpoint is a policy the
    learner no longer has. A checkpoint ahead of the site is fine: the learner crashed before reporting.
    ``reported_version`` is the newest version the learner reported trained (the site's ``learner_step``).
    """
    if checkpoint_version is None and reported_version > 0:
        raise ResumeError(f"job {job_id} already trained {reported_version} steps but there is no checkpoint at "
                          f"{path}; start the learner with the --checkpoint-dir (or --snapshot-dir) of the first run")
    if checkpoint_version is not None and published_version > checkpoint_version:
        raise ResumeError(f"job {job_id} published v{published_version} but the checkpoint at {path} holds "
                          f"v{checkpoint_version}; the newer policy is lost, so the run cannot continue consistently")


def completion_lengths(lengths: Any, max_new_tokens: int) -> dict[str, float]:
    """A batch's completion lengths in tokens as TRL logs them: mean, max, and the share that hit the limit."""
    lengths = [int(n) for n in lengths]
    if not lengths:
        return {}
    return {"mean": sum(lengths) / len(lengths), "max": float(max(lengths)),
            "clipped_ratio": sum(n >= max_new_tokens for n in lengths) / len(lengths)}


class LearnerLoop:
    """Consume admissible groups, train, checkpoint every ``checkpoint_every`` steps (and at every
    publication step, multiples of kappa, and the last step), acknowledge what the checkpoint holds.

    Invariant: no record is acknowledged unless it was deliberately dropped as stale or the update that
    trained it is inside a committed checkpoint. Entries trained since the last checkpoint stay pending
    in the Redis consumer group and their ids go into the next checkpoint (``trained_entry_ids``); once
    ``os.replace`` commits it they are acknowledged. After a crash the restarted learner loads that
    checkpoint (version ``c``) and

    - acknowledges the checkpoint's ``trained_entry_ids`` still pending (a crash between commit and
      acknowledgement): they are in the model and must not be trained again;
    - reads every other pending entry again, oldest first: its update was lost with the process, so it
      is trained again, from version ``c``, in the order it was first read.

    With ``background`` (the learner process), the checkpoint is written and its entries acknowledged by a thread
    of its own (:class:`~learner.checkpoint.Committer`) from a copy of the state while the next step trains; the
    order (commit, then acknowledge; checkpoint, then publication) is the same, and the training thread waits for
    it before handing over the next checkpoint and while the job has none on disk.

    So no acknowledged record is untrained and none is trained twice, the versions continue
    ``c+1, c+2, ...``, and (with the saved RNG) the resumed run takes the same updates an uninterrupted
    one would have. The published version never exceeds the checkpoint's: a publication step is always
    a checkpoint step, and the checkpoint is written first.
    """

    def __init__(self, *, spec: JobSpec, trainer: PolicyTrainer, consumer: StalenessGatedConsumer,
                 checkpoints: CheckpointStore, identity: dict[str, Any], checkpoint_every: int | None = None,
                 feeder: PromptFeeder | None = None, on_trained: Callable[[int, list[str]], None] | None = None,
                 background: bool = False, samples_every: int = 0, samples_per_step: int = 4,
                 scoring: Any = None) -> None:
        self.spec, self.trainer, self.consumer, self.checkpoints = spec, trainer, consumer, checkpoints
        self.identity, self.feeder, self.on_trained = identity, feeder, on_trained
        self.checkpoint_every = checkpoint_every or spec.kappa
        self.samples_every, self.samples_per_step = samples_every, samples_per_step  # 0: no samples
        self.version = 0
        self.uncommitted: list[str] = []  # trained, not yet in a committed checkpoint, so not acknowledged
        self.recent_rewards: collections.deque[float] = collections.deque(maxlen=10)
        self.recent_t_train: collections.deque[float] = collections.deque(maxlen=T_TRAIN_STEPS)
        self.pending_reports: list[dict] = []  # reports the site may not have, saved with the checkpoint
        # background: checkpoints are written on the committer's thread (learner/checkpoint.py), acknowledged after
        self.committer = Committer() if background else None
        # Trained entries still in the stream, as the feeder's thread counts them (``trained_in_stream``).
        self._in_stream, self._in_stream_lock = 0, threading.Lock()
        self.committed_once = False  # a checkpoint of this job is on disk (resumed from, or committed since)
        # A full disk (learner/diskroom.py): what the step reports say, the first version whose checkpoint is not on
        # disk (nothing from it on is published: a restart would train those versions again), when to try again,
        # what drops old snapshots as retention allows (the Publisher's store), and the ids of a checkpoint that
        # did not fit (the committer's thread only: they go with the next one).
        self.storage_warning = ""
        self.unsaved_since: int | None = None
        self.room = diskroom.Backoff()
        self.free_room: Callable[[], Any] | None = None
        self._unsaved: list[str] = []
        self.last_state: tuple[int, dict] | None = None  # (version, model copy) of the last checkpoint handed over
        # The owner's reward functions, scored here (learner/scoring.py): started as groups are read, so they
        # score while the current step trains; added to the rewards before the advantages.
        self.scoring = scoring
        if scoring is not None:
            consumer.on_read = lambda groups: scoring.submit(groups, self.version)

    @property
    def rng(self) -> random.Random | None:
        return self.feeder.rng if self.feeder is not None else None

    @property
    def t_train(self) -> float | None:
        """The job's T_train as the learner announces it (dataplane/timing.py ``t_train``), None before a step."""
        return t_train_of(self.recent_t_train)

    def resume(self) -> Checkpoint | None:
        """Continue from the committed checkpoint, if any (see the class docstring); None when starting fresh."""
        ckpt = self.checkpoints.load()
        if ckpt is None:
            return None
        if ckpt.job.get("job_id") != self.identity.get("job_id") or \
                ckpt.job.get("created_at") != self.identity.get("created_at"):
            raise ResumeError(f"{self.checkpoints.path} belongs to job {ckpt.job.get('job_id')} created "
                              f"{ckpt.job.get('created_at')}, not this one; use another --checkpoint-dir")
        self.trainer.load_state(ckpt.model, ckpt.optimizer, sharded=self.checkpoints.sharded_path(ckpt))
        self.committed_once = True
        restore_rng(ckpt.rng, self.rng)
        self.version = ckpt.version
        # Drops are counted in Redis as they are acknowledged (those after the checkpoint too); a job whose stream
        # predates that counter has only the checkpoint's figure.
        counted = self.consumer.replay.counters().get(DROPPED_STALE)
        self.consumer.dropped_total = counted if counted is not None else int(ckpt.state.get("dropped_total", 0))
        self.consumer.quarantine.restore(ckpt.state.get("quarantined", {}))
        self.recent_rewards.extend(ckpt.state.get("recent_rewards", []))
        # a checkpoint from before the median kept only a moving average: it stands for one step until more come
        self.recent_t_train.extend(ckpt.state.get("recent_t_train")
                                   or ([ckpt.state["t_train_avg"]] if ckpt.state.get("t_train_avg") else []))
        self.consumer.ack_ids(list(ckpt.trained_entry_ids))  # in the model already: never train them again
        log.info("resumed from %s at version %d", self.checkpoints.path, self.version)
        return ckpt

    def due(self, version: int) -> bool:
        return version % self.checkpoint_every == 0 or version % self.spec.kappa == 0 or \
            version >= self.spec.max_steps

    def step(self, *, timeout_s: float, report: Callable[[StepOutcome], dict] | None = None,
             unsent: Callable[[], list[dict]] | None = None) -> StepOutcome | None:
        """Wait up to ``timeout_s`` for R admissible records in whole groups, train on them, checkpoint
        when due; None when the data did not come (trained work since the last checkpoint is kept pending).
        ``report`` builds the step's report to the site and ``unsent`` lists the earlier reports still queued for
        it (learner/outbox.py); a checkpoint keeps both, so a learner killed before they reached the site sends
        them on restart (``pending_reports``): the steps the checkpoint holds are never missing from the site."""
        top_up = (lambda: self.feeder.request_top_up(trained=self.trained_in_stream)) \
            if self.feeder is not None else None
        wait = self.consumer.next_batch(groups=self.spec.groups_per_step, version=self.version,
                                        timeout_s=timeout_s, on_poll=top_up)
        if wait is None:
            return None
        scores = self.scoring.apply(wait.groups, self.version) if self.scoring is not None else None
        records = concat((g.packed for g in wait.groups), self.trainer.workspace)
        ids = [g.entry_id for g in wait.groups]
        lags = [self.version - v for v in records.versions]

        started = time.perf_counter()
        result = self.trainer.step(records)
        t_train = time.perf_counter() - started
        checkpointed = self.due(self.version + 1)
        # The checkpoints written while this step read and trained: waited for only before the next is handed over
        # (one at a time) and while none was ever committed (a restart needs one); else collected when done.
        settled = self.settle(wait=checkpointed or not self.committed_once)
        self.version += 1
        self.uncommitted.extend(ids)
        self._count_in_stream(len(ids))
        self.recent_rewards.append(result.reward_mean)
        self.recent_t_train.append(t_train)
        if self.on_trained is not None:
            self.on_trained(self.version, ids)

        outcome = StepOutcome(version=self.version, result=result, entry_ids=ids, lags=lags, wait_s=wait.wait_s,
                              dropped=wait.dropped, t_train=t_train, checkpointed=checkpointed,
                              quarantined=wait.quarantined, t_checkpoint=settled,
                              samples=self.samples_of(wait.groups), scores=scores,
                              lengths=completion_lengths(records.completion_lens, self.spec.max_new_tokens))
        if checkpointed:
            started = time.perf_counter()
            self.pending_reports = ([*(unsent() if unsent is not None else []), report(outcome)]
                                    if report is not None else [])
            self.commit()
            outcome.t_checkpoint += time.perf_counter() - started
        return outcome

    def samples_of(self, groups: list) -> list[dict]:
        """A few records of the batch just trained (at every ``samples_every``-th version), chosen with the job's
        seed (dataplane/samples.py)."""
        if not self.samples_every or self.version % self.samples_every:
            return []
        rows = ((g.worker_id, reward, version, prompt, completion) for g in groups if g.packed is not None
                for reward, version, prompt, completion in zip(g.packed.rewards, g.packed.versions, g.packed.prompts,
                                                                g.packed.completions, strict=True))
        return samples.pick(rows, seed=self.spec.seed, step=self.version, count=self.samples_per_step)

    def commit(self) -> None:
        """Write the checkpoint of the current version, then acknowledge the entries it contains. With a committer
        both happen on its thread, from a copy of the state, while the next step trains; :meth:`settle` collects
        them."""
        if not self.room.due():  # the disk was full: its entries stay unacknowledged and go with a later one
            self.unsaved_since = self.version if self.unsaved_since is None else self.unsaved_since
            log.info("checkpoint v%d skipped (%s)", self.version, self.storage_warning)
            return
        if self.committer is None:
            if not self._saved(self.checkpoint(copy=False)):
                return
            self._count_in_stream(-len(self.uncommitted))
            self.consumer.ack_ids(self.uncommitted)
            log.info("checkpoint v%d committed; %d entries acknowledged", self.version, len(self.uncommitted))
            self.uncommitted = []
            return
        checkpoint, version, ids = self.checkpoint(copy=True), self.version, self.uncommitted
        self.last_state = (version, checkpoint.model)
        self.uncommitted = []

        def write() -> list[str] | None:
            carried, self._unsaved = self._unsaved, []
            checkpoint.trained_entry_ids = carried + ids
            if not self._saved(checkpoint):
                self._unsaved = carried + ids
                return None
            self._count_in_stream(-len(carried + ids))
            self.consumer.replay.ack(carried + ids)  # in Redis; the reader's own records of it when collected
            log.info("checkpoint v%d committed; %d entries acknowledged", version, len(carried + ids))
            return carried + ids

        self.committer.submit(write)

    def _saved(self, checkpoint: Checkpoint) -> bool:
        """Save ``checkpoint``; False when the disk is full even after dropping what the snapshot store's retention
        allows (the last checkpoint stays whole: it is written aside, then renamed)."""
        for attempt in (1, 2):
            try:
                self.checkpoints.save(checkpoint)
            except OSError as err:
                if not diskroom.is_full(err):
                    raise
                if attempt == 1 and self.free_room is not None and self.free_room():
                    continue
                size = self.checkpoints.path.stat().st_size if self.checkpoints.exists() else 0
                self.storage_warning = diskroom.full_line("checkpoint store", needed_bytes=size,
                                                          root=self.checkpoints.root)
                self.unsaved_since = checkpoint.version if self.unsaved_since is None else self.unsaved_since
                log.error("checkpoint v%d not written (%s: %s); training goes on, tried again in %.0f s",
                          checkpoint.version, self.storage_warning, err.strerror, self.room.failed())
                return False
            if self.storage_warning.startswith("checkpoint"):
                self.storage_warning = ""
            self.unsaved_since = None
            self.room.succeeded()
            return True
        return False

    def trained_in_stream(self) -> int:
        """Trained entries still in the stream (their acknowledgement waits for a checkpoint): the feeder does not
        count them as work outstanding. Read on the feeder's thread after the stream's length, and lowered before
        the acknowledgement that deletes them, so an entry is never subtracted twice (the backlog is never
        overfilled); the worst a race does is top up one call late."""
        with self._in_stream_lock:
            return self._in_stream

    def _count_in_stream(self, change: int) -> None:
        with self._in_stream_lock:
            self._in_stream += change

    def settle(self, *, wait: bool = True, acknowledge: bool = True) -> float:
        """Collect what the committer finished (with ``wait``: everything handed over, waiting for it): its
        checkpoints are committed and their entries acknowledged. ``acknowledge`` false (Redis failed us): a failed
        acknowledgement is no error, the entries stay pending and a restart acknowledges them from its checkpoint.
        Returns the seconds spent."""
        if self.committer is None:
            return 0.0
        started = time.perf_counter()
        try:
            results = self.committer.finished(wait=wait)
        except RedisError:
            if acknowledge:
                raise
            results = []
        for ids in results:
            if ids is not None:  # a checkpoint's (a publication returns nothing)
                self.consumer.acknowledged(ids)
                self.committed_once = True
        return time.perf_counter() - started

    def write_checkpoint(self) -> None:
        """The first half of :meth:`commit`: after it returns, the checkpoint is the one a restart loads."""
        self.checkpoints.save(self.checkpoint(copy=False))

    def checkpoint(self, *, copy: bool) -> Checkpoint:
        """The checkpoint of the current version; with ``copy``, a whole model's tensors are CPU copies (to be
        written while training goes on), else the live tensors (on the CPU). A sharded model's shards are written
        here, by every rank (``PolicyTrainer.checkpoint_state``)."""
        weights = self.trainer.checkpoint_state(self.checkpoints, self.version, copy=copy)  # model, optimizer, shards
        with self.feeder.lock if self.feeder is not None else contextlib.nullcontext():  # between two draws
            rng = capture_rng(self.rng)
        return Checkpoint(
            version=self.version, **weights, rng=rng, trained_entry_ids=list(self.uncommitted),
            job=dict(self.identity),
            state={"dropped_total": self.consumer.dropped_total, "quarantined": self.consumer.quarantine.report(),
                   "recent_rewards": list(self.recent_rewards),
                   "recent_t_train": list(self.recent_t_train), "reports": self.pending_reports,
                   # the audits' probation per worker (learner/audit.py), restored by learner/trainer.py
                   "audit_probation": probation_state(self.consumer.audit, (g.worker_id for g in self.consumer.buffer))
                   if self.consumer.audit is not None else {}},
        )

    def close(self) -> None:
        """Let the committer, the reader and the prompt feeder finish what they were handed (failures there are
        :meth:`settle`'s to raise), and stop their threads."""
        if self.committer is not None:
            self.committer.close()
        self.consumer.close()
        if self.feeder is not None:
            self.feeder.close()

    def reward_target_reached(self) -> float | None:
        """The 10-step mean reward when it reached the job's target, else None."""
        target = self.spec.target_reward
        if target is None or len(self.recent_rewards) < (self.recent_rewards.maxlen or 0):
            return None
        mean = sum(self.recent_rewards) / len(self.recent_rewards)
        return mean if mean >= target else None

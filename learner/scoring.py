"""The owner's reward functions, scored on the learner (docs/rewards.md, "Where reward functions run").

A user function (``pkg.module:fn``) runs on the job's learner by default: the workers return completions (and the
built-in scores they compute), and the learner adds the owner's functions' weighted sum to each record's reward
before the advantages (paper Eq. (2) takes r as given: which machine computed it does not change the update). Its
code never leaves the owner's machine and no worker can forge its score.

Scoring runs in a pool of processes (``spawn``: no torch in them, and a function that hangs or leaks holds a child,
not the trainer), submitted as groups are read, so it overlaps the current step; :meth:`OwnerScoring.apply` waits
for a batch's scores only when the batch is formed. Each child builds the job's task from its spec, with the
learner's copy of the data set, and calls :meth:`~dataplane.tasks.base.TaskAdapter.owner_scores` with TRL's whole
signature (``trainer_state`` is :class:`TrainerState`). The owner's modules import as they would in a script run
where the learner was started: its working directory comes first on their import path (``echo2-learner`` started
in a checkout finds ``examples.rewards.sums_rewards``), then the learner's own.

Before the first step :meth:`OwnerScoring.preflight` calls every function on a few real rows and returns the
failure (the function's traceback, its last lines) that stops the job; while training, :meth:`OwnerScoring.apply`
says when a function's error rate over the last ``window`` records passed ``max_error_rate`` (the job pauses).
"""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import os
import sys
import threading
import traceback
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any

from dataplane.dataset.content import locate, register
from dataplane.rewards import TrainerState
from dataplane.tasks import TaskAdapter, build_task

MAX_REASON = 480  # the site keeps a job's reason to 500 characters
PENDING_MEMORY = 10_000  # groups scored ahead and not yet trained (dropped stale ones are forgotten past it)


@dataclass
class Scored:
    """One group's owner scores (per record) and what the functions did wrong."""

    rewards: list[float]
    each: dict[str, list[float]]
    errors: int = 0
    non_finite: int = 0
    last_error: str = ""
    failed: dict[str, int] = field(default_factory=dict)  # records each function failed on
    last_errors: dict[str, str] = field(default_factory=dict)  # each function's latest failure, one line


@dataclass
class BatchScores:
    """What :meth:`OwnerScoring.apply` reports for a batch: each function's mean score, the errors, and a reason to
    pause when a function failed too often."""

    means: dict[str, float] = field(default_factory=dict)
    errors: int = 0
    non_finite: int = 0
    last_error: str = ""
    pause_reason: str = ""
    # each function: {"mean", "records" (scored in this batch), "errors" (of those), "last_error" (its latest failure
    # since the learner started, one line; "" if none)}: the job page's per-function figures
    functions: dict[str, dict[str, Any]] = field(default_factory=dict)


_task: TaskAdapter | None = None  # in each pool process


def _start(task_spec: dict, digests: dict[str, str], path: list[str]) -> None:
    """A pool process: the learner's import path (the owner's modules), its data sets, the job's task."""
    global _task
    sys.path[:] = path
    for digest, where in digests.items():
        register(digest, where)
    _task = build_task(task_spec)


def _score(prompts: list[str], completions: list[str], completion_ids: list[list[int]], state: TrainerState,
           chat: Any) -> Scored:
    assert _task is not None
    before = _task.owner_stats()
    rewards, each = _task.owner_scores(prompts, completions, completion_ids=completion_ids, trainer_state=state,
                                       chat=chat)
    after = _task.owner_stats()
    delta = after.minus(before) if before is not None and after is not None else after
    if delta is None:
        return Scored(rewards, each)
    return Scored(rewards, each, errors=delta.errors, non_finite=delta.non_finite, last_error=delta.last_error,
                  failed=dict(delta.failed), last_errors=dict(delta.last_errors))


def _preflight(rows: int, chat: Any, state: TrainerState) -> str:
    assert _task is not None
    return _task.owner_preflight(rows, chat=chat, trainer_state=state)


def short_traceback(text: str, limit: int = MAX_REASON) -> str:
    """A failure's first line (which function, on what), then the end of its traceback (its last frames and the
    error), at most ``limit`` characters."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head, _, rest = text.partition("\n")
    head = head[:limit // 3]
    return f"{head}\n...{rest[-(limit - len(head) - 4):]}"


class OwnerScoring:
    """The pool scoring the owner's functions of one job; see the module's docstring."""

    def __init__(self, task_spec: dict, *, chat: Any, max_steps: int, processes: int = 2, window: int = 200,
                 max_error_rate: float = 0.5) -> None:
        task = build_task(task_spec)
        self.functions = task.learner_scored()
        self.chat, self.max_steps = chat, max_steps
        self.window, self.max_error_rate = window, max_error_rate
        digests = {d: str(locate(d)) for d in task.content_digests() if locate(d) is not None}
        self._start = (task_spec, digests, [os.getcwd(), *sys.path])
        self.processes = processes
        self.pool = self._new_pool()
        self.lock = threading.Lock()  # submit runs on the reader's thread and the training thread
        self.pending: collections.OrderedDict[str, concurrent.futures.Future] = collections.OrderedDict()
        self.recent: collections.deque[int] = collections.deque(maxlen=window)  # 1 per record a function failed on
        self.last_errors: dict[str, str] = {}  # each function's latest failure since this learner started

    def _new_pool(self) -> concurrent.futures.ProcessPoolExecutor:
        return concurrent.futures.ProcessPoolExecutor(self.processes, mp_context=multiprocessing.get_context("spawn"),
                                                      initializer=_start, initargs=self._start)

    @classmethod
    def for_job(cls, task_spec: dict, *, chat: Any, max_steps: int, **kwargs: Any) -> OwnerScoring | None:
        """The job's scoring pool, or None when the workers score its whole reward."""
        return cls(task_spec, chat=chat, max_steps=max_steps, **kwargs) if build_task(task_spec).learner_scored() \
            else None

    def preflight(self, rows: int = 4, timeout_s: float = 300.0) -> str:
        """Every function called on ``rows`` real rows of the data set: "" when each returned numbers, else the
        reason the job stops (the function, and the end of its traceback)."""
        state = TrainerState(global_step=0, max_steps=self.max_steps)
        try:
            return short_traceback(self.pool.submit(_preflight, rows, self.chat, state).result(timeout=timeout_s))
        except concurrent.futures.TimeoutError:
            return f"reward functions ({', '.join(self.functions)}) did not return within {timeout_s:.0f} s on " \
                   f"{rows} rows of the data set before step 1"
        except Exception as err:  # noqa: BLE001 - the child died or could not load the task: the job cannot score
            return short_traceback(f"reward functions could not be loaded on the learner before step 1: "
                                   f"{''.join(traceback.format_exception_only(err)).strip()}")

    def submit(self, groups: list, version: int) -> None:
        """Start scoring ``groups`` (StoredGroups, their ``packed`` records) unless already started; called as they
        are read, on whichever thread reads them."""
        state = TrainerState(global_step=version, max_steps=self.max_steps)
        with self.lock:
            for group in groups:
                packed = group.packed
                if packed is None or group.entry_id in self.pending:
                    continue
                ids = [list(view.completion_ids) for view in packed.views()]
                try:
                    self.pending[group.entry_id] = self.pool.submit(_score, list(packed.prompts),
                                                                    list(packed.completions), ids, state, self.chat)
                except BrokenProcessPool:  # replaced when its batch is formed (_scored), which submits it again
                    return
                while len(self.pending) > PENDING_MEMORY:
                    self.pending.popitem(last=False)[1].cancel()

    def _scored(self, group: Any, version: int, timeout_s: float) -> Scored:
        """``group``'s scores; a pool whose process died (the owner's code exited or crashed it) is replaced and
        the group scored once more, then counted as failed on every record."""
        reason = ""
        for _ in range(2):
            with self.lock:
                future = self.pending.pop(group.entry_id, None)
            if future is None:
                self.submit([group], version)
                with self.lock:
                    future = self.pending.pop(group.entry_id)
            try:
                return future.result(timeout=timeout_s)
            except BrokenProcessPool as err:
                with self.lock:
                    broken, self.pool = self.pool, self._new_pool()
                    self.pending.clear()  # every future of the broken pool failed with it: submitted again
                broken.shutdown(wait=False, cancel_futures=True)
                reason = f"a learner scoring process died while scoring ({err})"
        size = len(group.packed)
        last = f"{', '.join(self.functions)}: {reason}"[:200]
        return Scored([0.0] * size, {}, errors=size, last_error=last, failed=dict.fromkeys(self.functions, size),
                      last_errors=dict.fromkeys(self.functions, last))

    def apply(self, groups: list, version: int, timeout_s: float = 600.0) -> BatchScores:
        """Wait for ``groups``' scores and add them to their records' rewards (the workers' part stays in
        ``packed.worker_rewards``)."""
        self.submit(groups, version)
        out, sums, counts = BatchScores(), collections.Counter(), collections.Counter()
        failed: collections.Counter[str] = collections.Counter()
        for group in groups:
            if group.packed is None:
                continue
            scored = self._scored(group, version, timeout_s)
            packed = group.packed
            if getattr(packed, "worker_rewards", None) is None:
                packed.worker_rewards = list(packed.rewards)
            packed.rewards = [w + o for w, o in zip(packed.worker_rewards, scored.rewards, strict=True)]
            for name, values in scored.each.items():
                sums[name] += sum(values)
                counts[name] += len(values)
            out.errors += scored.errors
            out.non_finite += scored.non_finite
            out.last_error = scored.last_error or out.last_error
            failed.update(scored.failed)
            self.last_errors.update(scored.last_errors)
            bad = scored.errors + scored.non_finite
            self.recent.extend([1] * min(bad, len(packed)) + [0] * max(0, len(packed) - bad))
        out.means = {name: sums[name] / counts[name] for name in sums if counts[name]}
        out.functions = {name: {"mean": out.means.get(name), "records": counts[name], "errors": failed[name],
                                "last_error": self.last_errors.get(name, "").split("\n")[0][:200]}
                         for name in self.functions}
        rate = sum(self.recent) / len(self.recent) if self.recent else 0.0
        if len(self.recent) == self.window and rate > self.max_error_rate:
            last = out.last_error or "a non-finite score"
            out.pause_reason = (f"reward functions failed on {rate:.0%} of the last {self.window} records (above "
                                f"{self.max_error_rate:.0%}); last: {last}")[:MAX_REASON]
        return out

    def close(self) -> None:
        for future in self.pending.values():
            future.cancel()
        self.pending.clear()
        self.pool.shutdown(wait=True, cancel_futures=True)

"""Keep a job's prompt stream topped up from its task adapter, so workers never wait for prompts."""

from __future__ import annotations

import concurrent.futures
import random
import threading
from collections.abc import Callable

from dataplane.replay import Client, ReplayBuffer
from dataplane.tasks import TaskAdapter


class PromptFeeder:
    """``background``: :meth:`request_top_up` tops up on a thread of its own, so the training thread does not wait
    for Redis (two round trips a step); ``lock`` is held while prompts are drawn, and a checkpoint captures ``rng``
    under it (between draws)."""

    def __init__(self, client: Client, *, job_id: int, task: TaskAdapter, seed: int, backlog: int,
                 retry_for_s: float = 0.0, background: bool = False) -> None:
        self.job_id, self.task, self.backlog = job_id, task, backlog
        self.replay = ReplayBuffer(client, job_id, retry_for_s=retry_for_s)
        self.replay.ensure_groups()
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self._thread = concurrent.futures.ThreadPoolExecutor(1, "echo2-prompts") if background else None
        self._running: concurrent.futures.Future | None = None

    def outstanding(self, *, trained: int | Callable[[], int] = 0) -> int:
        """Groups not yet trained (``ReplayBuffer.outstanding``). ``trained`` groups are still in the
        trajectory stream only because their acknowledgement waits for the next checkpoint; they are done
        and not counted. Given as a callable, it is read after the stream (``LearnerLoop.trained_in_stream``)."""
        in_redis = self.replay.outstanding()
        return in_redis - (trained() if callable(trained) else trained)

    def top_up(self, *, trained: int | Callable[[], int] = 0) -> int:
        """Add prompt groups until ``backlog`` groups are outstanding; returns how many were added.

        Bounding all work in flight (not only unleased prompts) is the backpressure that keeps fast
        workers from running ahead of the learner and producing records that would arrive too stale.
        """
        missing = self.backlog - self.outstanding(trained=trained)
        if missing <= 0:
            return 0
        with self.lock:
            texts = [p.text for p in self.task.sample_prompts(self.rng, missing)]
        return self.replay.add_prompts(texts)

    def request_top_up(self, *, trained: int | Callable[[], int] = 0) -> None:
        """:meth:`top_up`, on the feeder's thread when it has one: at most one at a time (asked while one runs, it
        is left to the next call: the learner asks at every poll and every step); the previous one's failure (Redis
        gone past its retries) is raised here."""
        if self._thread is None:
            self.top_up(trained=trained)
            return
        if self._running is not None:
            if not self._running.done():
                return
            running, self._running = self._running, None
            running.result()
        self._running = self._thread.submit(self.top_up, trained=trained)

    def close(self) -> None:
        if self._thread is not None:
            self._thread.shutdown(wait=True)

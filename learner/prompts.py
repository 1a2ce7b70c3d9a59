"""Keep a job's prompt stream topped up from its task adapter, so workers never wait for prompts."""

from __future__ import annotations

import random

from dataplane.replay import Client, ReplayBuffer
from dataplane.tasks import TaskAdapter


class PromptFeeder:
    def __init__(self, client: Client, *, job_id: int, task: TaskAdapter, seed: int, backlog: int,
                 retry_for_s: float = 0.0) -> None:
        self.job_id, self.task, self.backlog = job_id, task, backlog
        self.replay = ReplayBuffer(client, job_id, retry_for_s=retry_for_s)
        self.replay.ensure_groups()
        self.rng = random.Random(seed)

    def outstanding(self, *, trained: int = 0) -> int:
        """Groups not yet trained (``ReplayBuffer.outstanding``). ``trained`` groups are still in the
        trajectory stream only because their acknowledgement waits for the next checkpoint; they are done
        and not counted."""
        return self.replay.outstanding() - trained

    def top_up(self, *, trained: int = 0) -> int:
        """Add prompt groups until ``backlog`` groups are outstanding; returns how many were added.

        Bounding all work in flight (not only unleased prompts) is the backpressure that keeps fast
        workers from running ahead of the learner and producing records that would arrive too stale.
        """
        missing = self.backlog - self.outstanding(trained=trained)
        if missing <= 0:
            return 0
        return self.replay.add_prompts(p.text for p in self.task.sample_prompts(self.rng, missing))

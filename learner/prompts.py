"""Keep a job's prompt stream topped up from its task adapter, so workers never wait for prompts."""

from __future__ import annotations

import random
import uuid

import redis

from dataplane import streams
from dataplane.tasks import TaskAdapter


class PromptFeeder:
    def __init__(self, client: redis.Redis, *, job_id: int, task: TaskAdapter, seed: int, backlog: int) -> None:
        self.client, self.job_id, self.task, self.backlog = client, job_id, task, backlog
        self.key = streams.prompts_key(job_id)
        self.rng = random.Random(seed)
        try:
            client.xgroup_create(self.key, streams.PROMPT_GROUP, id="0", mkstream=True)
        except redis.ResponseError as err:
            if "BUSYGROUP" not in str(err):
                raise

    def outstanding(self, *, trained: int = 0) -> int:
        """Groups not yet trained: prompts waiting or leased, plus returned groups not yet acknowledged.

        Both streams delete what is done (a returned prompt, an acknowledged group), so their lengths
        count what is not. ``trained`` groups are still in the trajectory stream only because their
        acknowledgement waits for the next checkpoint; they are done and not counted.
        """
        pipe = self.client.pipeline()
        pipe.xlen(self.key)
        pipe.xlen(streams.trajectories_key(self.job_id))
        return sum(pipe.execute()) - trained

    def top_up(self, *, trained: int = 0) -> int:
        """Add prompt groups until ``backlog`` groups are outstanding; returns how many were added.

        Bounding all work in flight (not only unleased prompts) is the backpressure that keeps fast
        workers from running ahead of the learner and producing records that would arrive too stale.
        """
        missing = self.backlog - self.outstanding(trained=trained)
        if missing <= 0:
            return 0
        pipe = self.client.pipeline()
        for prompt in self.task.sample_prompts(self.rng, missing):
            pipe.xadd(self.key, {"group_id": uuid.uuid4().hex[:16], "prompt": prompt.text})
        pipe.execute()
        return missing

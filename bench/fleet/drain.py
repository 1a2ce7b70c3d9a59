"""``--drain``: a bench-side consumer that keeps the job's prompts topped up for the whole fleet and acknowledges
trajectory groups as fast as the site appends them, so the bench measures the site's ingest ceiling rather than
the learner's (which tops up only ``2 x groups per step`` prompts: its own training speed bounds ingest). It reads
through the learner's consumer group, so the learner still trains on the share it reads."""

from __future__ import annotations

import random
import threading

from dataplane.replay import LEARNER_GROUP, ReplayBuffer, prompts_key, trajectories_key
from dataplane.tasks import build_task


class Drain:
    def __init__(self, client, *, job_id: int, task: dict, prompts: int) -> None:
        """``client``: a Redis client that does not decode replies (stored groups are binary)."""
        self.client, self.job_id, self.target = client, job_id, prompts
        self.replay = ReplayBuffer(client, job_id)
        self.replay.ensure_groups()
        self.task, self.rng = build_task(task), random.Random(0)
        self.acknowledged = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._run, name="drain", daemon=True)
        self.error: BaseException | None = None

    def start(self) -> Drain:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(10)

    def _run(self) -> None:
        stream = trajectories_key(self.job_id)
        try:
            while not self.stopping.is_set():
                missing = self.target - self.client.xlen(prompts_key(self.job_id))
                if missing > 0:
                    self.replay.add_prompts([p.text for p in self.task.sample_prompts(self.rng, missing)])
                entries = self.client.xreadgroup(LEARNER_GROUP, "bench-drain", {stream: ">"}, count=1000, block=100)
                ids = [entry_id for _, rows in entries or [] for entry_id, _ in rows]
                if ids:
                    pipe = self.client.pipeline()
                    pipe.xack(stream, LEARNER_GROUP, *ids)
                    pipe.xdel(stream, *ids)
                    pipe.execute()
                    self.acknowledged += len(ids)
        except BaseException as err:  # noqa: BLE001 - reported by the bench in its row
            self.error = err

"""Turn leased prompt groups into version-tagged, rewarded records tau = (x, y, r, v, Omega)."""

from __future__ import annotations

from dataclasses import dataclass

from dataplane.tasks import TaskAdapter

from .engines.base import Engine, SamplingParams


@dataclass(frozen=True)
class GroupLease:
    lease_id: str
    group_id: str
    prompt: str


def rollout_groups(engine: Engine, task: TaskAdapter, leases: list[GroupLease], *, job_id: int, n: int,
                   params: SamplingParams, version: int) -> list[list[dict]]:
    """Sample ``n`` completions of every leased prompt in one batch and score them.

    Every record carries ``version``, the snapshot the engine held for the whole batch.
    """
    completions = engine.generate([lease.prompt for lease in leases], n=n, params=params)
    return [
        [
            {
                "job_id": job_id, "lease_id": lease.lease_id, "group_id": lease.group_id, "prompt": lease.prompt,
                "prompt_ids": c.prompt_ids, "completion": c.text, "completion_ids": c.completion_ids,
                "logprobs": c.logprobs, "reward": task.reward(lease.prompt, c.text), "version": version,
            }
            for c in group
        ]
        for lease, group in zip(leases, completions, strict=True)
    ]

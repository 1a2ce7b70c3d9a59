"""Turn leased prompt groups into version-tagged, rewarded records tau = (x, y, r, v, Omega)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

from dataplane.records import MAX_REWARD_ERRORS, RewardErrors, Trajectory, TrajectoryGroup
from dataplane.rewards import RewardStats
from dataplane.tasks import TaskAdapter
from dataplane.tasks.episodes import Turn

from .engines.base import Engine, SamplingParams

log = logging.getLogger("echo2.agent")


@dataclass(frozen=True)
class GroupLease:
    lease_id: str
    group_id: str
    prompt: str


def rollout_groups(engine: Engine, task: TaskAdapter, leases: list[GroupLease], *, job_id: int, n: int,
                   params: SamplingParams, version: int) -> list[TrajectoryGroup]:
    """Sample ``n`` completions of every leased prompt in one batch and score them.

    Every record carries ``version``, the snapshot the engine held for the whole batch. A multi-turn task
    (``task.multi_turn``, e.g. ``sandbox``) plays whole episodes instead: see :func:`rollout_episodes`.
    """
    if task.multi_turn:
        before = task.reward_stats()
        groups = rollout_episodes(engine, task, leases, job_id=job_id, n=n, params=params, version=version)
        return [with_reward_errors(groups[0], task, before), *groups[1:]] if groups else groups
    completions = engine.generate([lease.prompt for lease in leases], n=n, params=params)
    out = []
    for lease, group in zip(leases, completions, strict=True):
        before = task.reward_stats()
        out.append(with_reward_errors(TrajectoryGroup.of([
            Trajectory(job_id=job_id, lease_id=lease.lease_id, group_id=lease.group_id, prompt=lease.prompt,
                       prompt_ids=c.prompt_ids, completion=c.text, completion_ids=c.completion_ids,
                       logprobs=c.logprobs, reward=task.reward(lease.prompt, c.text), version=version)
            for c in group
        ]), task, before))
    return out


def with_reward_errors(group: TrajectoryGroup, task: TaskAdapter, before: RewardStats | None) -> TrajectoryGroup:
    """``group`` carrying what the task's reward functions did wrong since ``before`` (``task.reward_stats()`` taken
    before it was scored), for the site to count per job (docs/rewards.md); unchanged when nothing went wrong."""
    after = task.reward_stats()
    if after is None:
        return group
    delta = after.minus(before) if before is not None else after
    if not delta.errors and not delta.non_finite:
        return group
    errors = RewardErrors(errors=min(delta.errors, MAX_REWARD_ERRORS), non_finite=min(delta.non_finite,
                          MAX_REWARD_ERRORS), last_error=delta.last_error.replace("\x00", "")[:200])
    # Loud where it happens too: a provider running an owner's function sees it fail in its own log.
    log.warning("job %s: reward functions failed on %d records (%d non-finite); last: %s", group.records[0].job_id,
                delta.errors + delta.non_finite, delta.non_finite, errors.last_error)
    return group.model_copy(update={"reward_errors": errors})


def rollout_episodes(engine: Engine, task: TaskAdapter, leases: list[GroupLease], *, job_id: int, n: int,
                     params: SamplingParams, version: int) -> list[TrajectoryGroup]:
    """Play ``n`` episodes per leased prompt, all in lockstep (one engine call per turn); the task plays them
    (:meth:`TaskAdapter.play`), the engine samples each turn.

    The record's completion is every turn after the prompt: assistant turns learn (loss mask 1), the
    environment's replies do not (mask 0); the reward is the episode's return (paper appendix F.5).
    Needs an engine with ``generate_ids`` (both built-in engines have it).
    """
    prompts = [lease.prompt for lease in leases for _ in range(n)]
    prompt_ids = [engine.encode_prompt(p) for p in prompts]

    def generate(contexts: list[list[int]]) -> list[Turn]:
        groups = engine.generate_ids(contexts, n=1, params=params, stop=["</answer>"])
        return [Turn(ids=c.completion_ids, logprobs=c.logprobs, text=c.text) for (c,) in groups]

    episodes = task.play(prompts, generate=generate, prompt_ids=prompt_ids,
                         encode=lambda text: engine.tokenizer(text, add_special_tokens=False)["input_ids"])
    return [
        TrajectoryGroup.of([episodes[i * n + k].record(job_id=job_id, lease_id=lease.lease_id,
                                                       group_id=lease.group_id, version=version)
                            for k in range(n)])
        for i, lease in enumerate(leases)
    ]

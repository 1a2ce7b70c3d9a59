"""A dishonest provider's agent, for the audit tests only: the real ``echo2-agent`` with its rollouts tampered.

``python -m tests.forging_agent logprobs|rewards ARGS...`` runs ``echo2-agent ARGS...`` whose every generated
group is forged before it is sent: ``logprobs`` claims a confident -0.05 per token (what a worker would send to
save the compute, or to steer the importance ratio); ``rewards`` reports every answer as right. Everything else
(the protocol, leases, installs) is the real agent's code. Never imported by the project."""

from __future__ import annotations

import sys

from dataplane.records import TrajectoryGroup
from worker_agent import cli, rollout_loop

FORGERIES = {
    "logprobs": lambda record: {"logprobs": [-0.05] * len(record.logprobs)},
    "rewards": lambda record: {"reward": 1.0},
}


def forging(rollout_groups, forge):
    def forged(*args, **kwargs) -> list[TrajectoryGroup]:
        return [TrajectoryGroup.of([r.model_copy(update=forge(r)) for r in group.records])
                for group in rollout_groups(*args, **kwargs)]

    return forged


if __name__ == "__main__":
    kind, *argv = sys.argv[1:]
    rollout_loop.rollout_groups = forging(rollout_loop.rollout_groups, FORGERIES[kind])
    sys.argv = ["echo2-agent", *argv]
    sys.exit(cli.main())

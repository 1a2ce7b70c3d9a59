"""Reward functions as RL users write them (TRL's ``reward_funcs``), weighted, with built-in scorers (docs/rewards.md).

A task spec names its reward (``"reward": "math_verify"``, ``"pkg.module:fn"`` or a weighted list);
:func:`parse_reward_spec` checks it without importing anything (the site), :func:`build_reward` builds the callable
:class:`Reward` (workers, the learner), refusing user code where the machine did not opt in
(:class:`UserCodeRefused`). A reward never raises for what a function does: it scores the record with the
function's fallback and counts it (:class:`RewardStats`).
"""

from .builtins import SCORERS
from .reward import Reward, RewardStats, TrainerState, build_reward, load_function
from .spec import (
    REFUSED,
    CannotServe,
    RewardError,
    RewardFunctionSpec,
    RewardSpec,
    ScorerMissing,
    UserCodeRefused,
    parse_reward_spec,
)

__all__ = ["REFUSED", "SCORERS", "CannotServe", "Reward", "RewardError", "RewardFunctionSpec", "RewardSpec",
           "RewardStats", "ScorerMissing", "TrainerState", "UserCodeRefused", "build_reward", "load_function",
           "parse_reward_spec"]

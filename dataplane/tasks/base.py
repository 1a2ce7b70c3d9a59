"""Task adapters: how a workload becomes prompts and rewards (paper appendix F.1).

An adapter (i) builds prompts x, (ii) defines the reward r = R(x, y) that rollout workers compute,
and (iii) says which completion tokens learn. The learner asks it for prompts; every worker holds the
same adapter (built from the job's task spec) to score its own completions.
"""

from __future__ import annotations

import random
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..records import MAX_REWARD, RecordLimits
from ..registry import Registry

if TYPE_CHECKING:
    from ..rewards import RewardStats
    from .episodes import Episode, Turn


class TaskSpecError(ValueError):
    """A task spec that names an unknown task or carries bad options."""


@dataclass(frozen=True)
class Prompt:
    """One prompt to sample a GRPO group from. ``text`` is all a worker needs to score an answer."""

    text: str


class TaskAdapter(ABC):
    """Base class for task adapters. Subclasses are built from a JSON spec ``{"name": ..., **options}``."""

    name: str = ""
    #: Characters the task's prompts and answers are written in (used to build tiny tokenizers).
    alphabet: str = ""
    #: The rewards :meth:`reward` can return, ``(low, high)``. The site refuses a record whose reward is
    #: outside it and the learner quarantines one (docs/trust.md): a worker cannot claim a reward its task
    #: never gives. Every adapter declares its own; the default only keeps rewards float32-safe.
    reward_range: tuple[float, float] = (-MAX_REWARD, MAX_REWARD)
    #: A worker gets this task's records by playing whole episodes of several turns (:meth:`play`), not by
    #: sampling one completion per prompt and scoring it with :meth:`reward`.
    multi_turn: bool = False
    #: The digest of the job's code package (dataplane/usercode.py): the owner's modules that the task imports where
    #: the workers are, shipped by content. A task that runs user code takes it as its ``code`` option; None: none.
    code: str | None = None

    @abstractmethod
    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        """Draw ``count`` prompts."""

    @abstractmethod
    def reward(self, prompt: str, completion: str) -> float:
        """Score ``completion`` for ``prompt``; malformed answers score 0, never raise."""

    def spec(self) -> dict[str, Any]:
        """The JSON spec that rebuilds this adapter."""
        return {"name": self.name}

    def prepare(self, *, allow_user_code: bool) -> None:
        """Get ready to score on this machine: an agent calls it before it leases work for the job, the learner
        before it audits. A task that runs code its spec names (a reward function ``pkg.module:fn``, a verifiers
        environment) loads it here, never in its constructor (the site builds tasks to validate specs and must not
        run owners' code), and raises :class:`~dataplane.rewards.UserCodeRefused` when ``allow_user_code`` is false
        (the provider did not run ``echo2-agent run --allow-user-code``; the learner passes true: it is the owner's
        machine). Built-ins load nothing."""
        return None

    def user_code(self) -> list[str]:
        """The job owner's code this task runs where it scores (``pkg.module:fn`` references; empty: none). Read from
        the spec, importing nothing: the site matches a job naming any only to workers whose providers opted in
        (docs/trust.md, "User code on workers"); :meth:`prepare` refuses it where they did not."""
        return []

    def learner_scored(self) -> list[str]:
        """The reward functions the job's learner scores (the owner's code, by default), after the workers returned
        the completions: the learner adds what :meth:`owner_scores` gives to each record's reward (learner/scoring.py).
        Empty: the workers' reward is the whole reward."""
        return []

    def owner_scores(self, prompts: list[str], completions: list[str], *, completion_ids: list[list[int]],
                     trainer_state: Any, chat: Any) -> tuple[list[float], dict[str, list[float]]]:
        """The learner's part of each record's reward, and each function's scores (a task with
        :meth:`learner_scored`)."""
        raise NotImplementedError(f"task {self.name!r} has no reward functions scored on the learner")

    def owner_preflight(self, count: int, *, chat: Any, trainer_state: Any = None) -> str:
        """The functions of :meth:`learner_scored` called once on ``count`` real rows before training: "" when they
        returned numbers, else what went wrong (with the function's traceback)."""
        return ""

    def owner_stats(self) -> RewardStats | None:
        """What the functions of :meth:`learner_scored` did wrong on this machine so far."""
        return None

    def content_digests(self) -> list[str]:
        """The data sets this task reads, by digest (docs/datasets.md): the learner serves each to the job's workers,
        and an agent fetches each it lacks (into its cache) before :meth:`prepare`; the job's code package
        (:attr:`code`) is one of them, last. Empty for a task whose data and code ship with it."""
        return [self.code] if self.code else []

    def reward_stats(self) -> RewardStats | None:
        """What the task's reward functions did wrong so far (errors, non-finite scores; cumulative), for the agent
        to report per job; None for a task that runs no user reward functions."""
        return None

    def max_completion_tokens(self, max_new_tokens: int) -> int:
        """The longest completion an honest worker returns for a job sampling ``max_new_tokens`` per turn:
        one turn here; a multi-turn task adds its turns and the environment's replies."""
        return max_new_tokens

    def play(self, prompts: list[str], *, generate: Callable[[list[list[int]]], list[Turn]],
             encode: Callable[[str], list[int]], prompt_ids: list[list[int]] | None = None) -> list[Episode]:
        """Play one episode per prompt, all in lockstep (a :attr:`multi_turn` task says how).

        ``generate(contexts)`` samples one assistant turn for each context (token ids: the prompt and the turns so
        far); ``encode(text)`` gives the token ids of the environment's replies; ``prompt_ids`` the engine's own
        encoding of the prompts. Each :class:`~dataplane.tasks.episodes.Episode` becomes one record."""
        raise NotImplementedError(f"task {self.name!r} plays no episodes: one completion per prompt")

    def record_limits(self, *, max_new_tokens: int, vocab_size: int | None) -> RecordLimits:
        """What a record of this task may hold under a job's ``max_new_tokens`` and model (``vocab_size``)."""
        low, high = self.reward_range
        return RecordLimits(vocab_size=vocab_size, max_completion_tokens=self.max_completion_tokens(max_new_tokens),
                            reward_range=(max(low, -MAX_REWARD), min(high, MAX_REWARD)))


#: The task adapters of this package by name, filled by :func:`register_task` (dataplane/tasks/__init__.py).
TASKS: Registry[type[TaskAdapter]] = Registry("task")


def register_task(cls: type[TaskAdapter]) -> type[TaskAdapter]:
    """Class decorator: make ``cls`` a task a job can name (``{"name": cls.name, ...options}``)."""
    return TASKS.add(cls.name, cls, same=cls)

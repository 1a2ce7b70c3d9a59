"""Reward functions in each shape TRL's GRPOTrainer calls (its ``reward_funcs``), as an owner writes them: the
learner imports them as ``tests.owner_rewards:<name>`` (tests/learner/test_owner_rewards.py)."""

from __future__ import annotations

import asyncio
import re

CALLS: list[dict] = []  # what the last call received, in the process that scored it


def _number(text: str) -> str | None:
    found = re.match(r"\s*(\d+)", text)
    return found.group(1) if found else None


def plain(completions, **kwargs):
    """TRL's README example shape: completions only."""
    return [1.0 if _number(c) is not None else 0.0 for c in completions]


def correct(prompts, completions, answer, **kwargs):
    """The dataset's answer column by name."""
    return [1.0 if _number(c) == str(a) else 0.1 for c, a in zip(completions, answer, strict=True)]


def chat(prompts, completions, **kwargs):
    """A chat job: prompts and completions are lists of messages."""
    assert isinstance(prompts[0], list) and prompts[0][-1]["role"] == "user", prompts[0]
    return [1.0 if _number(c[0]["content"]) is not None else 0.2 for c in completions]


def with_columns(completions, answer, max_term, **kwargs):
    """Every column comes, none listed in the job."""
    return [0.5 + 0.1 * m + (0.5 if _number(c) == str(a) else 0.0)
            for c, a, m in zip(completions, answer, max_term, strict=True)]


def by_ids(completion_ids, **kwargs):
    """Token ids as TRL passes them: one list per completion."""
    return [len(ids) / 4 for ids in completion_ids]


def by_state(completions, trainer_state, **kwargs):
    """TRL's trainer_state: its global_step."""
    return [1.0 / (1 + trainer_state.global_step)] * len(completions)


async def later(completions, **kwargs):
    """An async def function, awaited."""
    await asyncio.sleep(0)
    return [1.0 if _number(c) is not None else 0.3 for c in completions]


def broken(completions, **kwargs):
    """Raises on every call."""
    return [1 / 0 for _ in completions]


def worded(completions, **kwargs):
    """Returns something that is not a number."""
    return ["good" for _ in completions]


def conversation(prompts, completions, answer, **kwargs):
    """A conversational data set: the row's messages, system turn first, then the completion as a message."""
    assert prompts[0][0] == {"role": "system", "content": "sum"}, prompts[0]
    return [1.0 if _number(c[0]["content"]) == a else 0.1 for c, a in zip(completions, answer, strict=True)]


def flaky(completions, **kwargs):
    """Raises on completions that are not a number: some records fail, the others score."""
    return [float(int(c)) for c in completions]


def dies(completions, **kwargs):
    """Ends its process on the completion "die" (what a crashing extension does); scores the others."""
    import os

    if "die" in completions:
        os._exit(3)
    return [1.0 for _ in completions]

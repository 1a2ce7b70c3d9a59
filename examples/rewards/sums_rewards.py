"""Reward functions in TRL's ``reward_funcs`` shape for examples/jobs/dataset-parquet.toml: each takes the batch's
prompts and completions and the data set's columns as keyword arguments (``answer``, ``max_term``) and returns one
float per completion. The job's learner scores them (docs/rewards.md): it imports them as
``examples.rewards.sums_rewards`` from the directory it was started in (the repository's root)."""

from __future__ import annotations

import re


def correct(prompts: list[str], completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """1 when the completion's first number is the answer, else 0."""
    found = [re.match(r"\s*(\d+)", completion) for completion in completions]
    return [1.0 if match and match.group(1) == str(gold) else 0.0 for match, gold in zip(found, answer, strict=True)]


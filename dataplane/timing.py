"""Where a learner step's wall time goes: the honest bubble.

The paper's bubble, ``wait / (wait + T_train)``, leaves out everything else the learner does between two
updates: writing checkpoints, writing and announcing snapshots, reporting to the site. A step's wall time here
runs from the start of the previous step's report to the start of this one's, and is split into

- ``wait``: waiting for admissible data (the paper's bubble);
- ``train``: the update (``T_train``);
- ``checkpoint``: on checkpoint steps, copying the state for the committer's thread, which writes it and
  acknowledges what it holds while the next step trains; waiting for that thread when it is behind;
- ``publish``: handing the snapshot to the committer's thread (every kappa steps; it writes and announces it after
  the checkpoint);
- ``report``: reporting the previous step to the site (with the outbox, a queue append);
- ``eval``: scoring the policy on held-out problems after this step, when the job's ``eval`` says so
  (learner/evaluation.py);
- ``other``: the rest (log lines, the target check, the loop itself).

``train_share`` is ``train / wall``: the figure to watch ("when data is waiting, T_train is at least 90% of
the step's wall time").
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable

PARTS = ("wait", "train", "checkpoint", "publish", "report", "eval")

T_TRAIN_STEPS = 10
"""Steps the job's ``T_train`` is the median of (docs/glossary.md)."""


def t_train(step_train_s: Iterable[float]) -> float | None:
    """The job's ``T_train``: the median of its last :data:`T_TRAIN_STEPS` steps' train times (the update alone,
    ``train`` above), None before a step. A median, not a mean: a first step that warms caches up (seconds where
    the rest take milliseconds) moves it by one rank, never by its size, and it follows a change of speed within
    half the window. The learner announces it (learner/loop.py) and the site shows and plans with exactly that
    figure: the job page's T_train card, the target's formula, the plan and ``echo2 job status``."""
    times = [float(t) for t in step_train_s][-T_TRAIN_STEPS:]
    return statistics.median(times) if times else None


def step_split(wall_s: float, **parts: float) -> dict[str, float]:
    """The split of ``wall_s`` into ``PARTS`` (seconds) and ``other``, with ``wall`` and ``train_share``.

    ``other`` is what the named parts leave (never negative: the parts are measured with the same clock
    inside the wall, so a negative rest is rounding)."""
    unknown = set(parts) - set(PARTS)
    if unknown:
        raise ValueError(f"unknown parts of a step: {sorted(unknown)}")
    split = {name: max(0.0, float(parts.get(name, 0.0))) for name in PARTS}
    wall = max(float(wall_s), sum(split.values()))
    split["other"] = wall - sum(split.values())
    split["wall"] = wall
    split["train_share"] = split["train"] / wall if wall > 0 else 0.0
    return split


def split_line(split: dict[str, float]) -> str:
    """``train 91% · wait 5% · ...`` of a :func:`step_split`, largest first, for the job page."""
    wall = split.get("wall") or 0.0
    if wall <= 0:
        return "–"
    named = sorted(((split.get(k, 0.0), k) for k in (*PARTS, "other")), reverse=True)
    return " · ".join(f"{k} {100 * v / wall:.0f}%" for v, k in named if v / wall >= 0.005)

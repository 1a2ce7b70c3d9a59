"""Samples: a handful of the records a learner step trained on, as the owner reads them (the job page, ``echo2 job
samples``, TensorBoard and W&B; docs/learner.md "Samples").

One row is ``(step, version, worker, reward, prompt, completion)``. The learner cuts the texts to the bounds below
and drops NUL characters (which PostgreSQL cannot store) before it reports them; the site refuses a report whose
rows break the bounds, naming the field.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

MAX_SAMPLES_PER_REPORT = 16
"""Most rows one step's report may carry."""
PROMPT_CHARS = 2000
"""A sample's prompt is cut to this many characters (the start is kept: it says what was asked)."""
COMPLETION_CHARS = 4000
"""A sample's completion is cut to this many characters."""
SAMPLES_KEPT_PER_JOB = 200
"""The site keeps a job's newest this many samples."""


def clean(text: str, limit: int) -> str:
    """``text`` without NUL characters, cut to ``limit`` characters (an ellipsis marks the cut)."""
    text = text.replace("\x00", "")
    return text if len(text) <= limit else text[:limit - 1] + "…"


def pick(records: Iterable[tuple[int, float, int, str, str]], *, seed: int, step: int,
         count: int) -> list[dict[str, Any]]:
    """``count`` of ``records`` (worker, reward, version, prompt, completion), chosen by a generator seeded with the
    job's seed and the step: the same batch at the same step always gives the same rows, in batch order."""
    records = list(records)
    chosen = sorted(random.Random(f"{seed}/{step}").sample(range(len(records)), min(count, len(records))))
    return [{"step": step, "version": records[i][2], "worker": records[i][0], "reward": records[i][1],
             "prompt": clean(records[i][3], PROMPT_CHARS), "completion": clean(records[i][4], COMPLETION_CHARS)}
            for i in chosen]

"""The learner's publication policy: which versions are published, and when.

(Being gathered here from learner/trainer.py and learner/loop.py; see the Publisher.)
"""

from __future__ import annotations

import torch


def republish_on_resume(checkpoint_version: int, *, kappa: int, published_version: int) -> bool:
    """Whether a restarted learner at ``checkpoint_version`` publishes it at once: the site lacks the last
    publication due by then (the learner died before its outbox announced it). Otherwise the agents go on
    generating under an older version, and past S versions behind every record they return is dropped stale,
    so the learner never trains the step that would publish the next one."""
    return published_version < checkpoint_version - checkpoint_version % kappa


def _each_tensor_once(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A checkpoint's copy of the weights as a snapshot publishes them: a tied tensor once, under its first name
    (the copy keeps tied tensors shared, as ``PolicyTrainer.full_state`` gives them)."""
    seen: set[int] = set()
    return {name: t for name, t in state.items() if not (t.data_ptr() in seen or seen.add(t.data_ptr()))}

"""Quarantine: the learner's own check of every group it reads, before the group can reach the loss.

The site checks returned groups against the job's limits (docs/trust.md, "Record checks"), but the stream
may still hold what it never checked: entries written before the checks existed, before the learner reported
the vocabulary, or by hand. One such group must not stop a job (a token id past the vocabulary is an
IndexError in the embedding) or poison it (a reward that overflows float32 turns every advantage into NaN),
and must not come back on every resume. So each group read is checked against the model's own limits; a bad
one is acknowledged at once (it is deliberately dropped, like a stale one), counted against the worker the
site accepted it from, and reported with the step; the step goes on with the good groups.
"""

from __future__ import annotations

import collections
import logging
from dataclasses import dataclass, field

import numpy as np
import torch

from dataplane.packed import PackedRecords
from dataplane.records import MIN_LOGPROB, RecordLimits, prompt_token_bound, record_problem, value_problem
from dataplane.replay import StoredGroup

from .batch import Workspace

log = logging.getLogger("echo2.learner")


def model_vocab_size(module: torch.nn.Module) -> int | None:
    """Rows of ``module``'s input embedding: the token ids it can take (a tokenizer may be smaller; the
    embedding is what an out-of-range id crashes). None for a model without one."""
    embeddings = getattr(module, "get_input_embeddings", None)
    if callable(embeddings) and isinstance(embeddings(), torch.nn.Embedding):
        return int(embeddings().num_embeddings)
    return getattr(getattr(module, "config", None), "vocab_size", None)


def stored_problem(stored: StoredGroup, limits: RecordLimits) -> tuple[str, int]:
    """Why ``stored`` must not be trained on ("" when it may), and how many records that counts: an entry that is
    no group, or whose values the schema refuses (``value_problem``), counts as one; a group outside ``limits``
    counts its records. Goes record by record: the reasons, for the groups :func:`all_fit` did not pass."""
    if stored.packed is None:
        return stored.problem or "not a trajectory group", 1
    for i, rec in enumerate(stored.packed.views()):
        problem = value_problem(rec)
        if problem:
            return f"records.{i}: {problem}", 1
        problem = record_problem(rec, limits)
        if problem:
            return f"records.{i}.{problem}", len(stored.packed)
    return "", 0


SMALL = 8192  # elements of a read's column joined into a fresh bytes object; past it, into the workspace


def all_fit(packed: PackedRecords | list[PackedRecords], limits: RecordLimits,
            workspace: Workspace | None = None) -> bool:
    """Whether every record of ``packed`` (one pack, or a read's) passes :func:`stored_problem` (schema values and
    ``limits``), checked on all of them at once: a few array reductions instead of a loop per record. Never true
    where a record fails (each check is one of :func:`stored_problem`'s); the reason, when false, is found record by
    record. The flat columns are joined in ``workspace`` when given."""
    packs = [p for p in (packed if isinstance(packed, list) else [packed]) if len(p)]
    if not packs:
        return True

    def column(name: str, dtype: type) -> np.ndarray:
        blocks = [getattr(pack, name) for pack in packs]
        size = sum(map(len, blocks))
        if len(blocks) == 1:
            return np.frombuffer(blocks[0], dtype=dtype)
        if workspace is None or size < SMALL:  # small: one bytes object beats a numpy call per block
            return np.frombuffer(b"".join(blocks), dtype=dtype)
        parts = [np.frombuffer(block, dtype=dtype) for block in blocks]
        return np.concatenate(parts, out=workspace.take(f"check.{name}", (size,), dtype))

    tokens, mask, logprobs = column("tokens", np.int64), column("mask", np.int64), column("logprobs", np.float64)
    rewards = np.array([r for pack in packs for r in pack.rewards], dtype=np.float64)
    prompts = {(p, n) for pack in packs for p, n in zip(pack.prompts, pack.prompt_lens, strict=True)}  # a group's one
    low, high = limits.reward_range
    extra = limits.prompt_extra_tokens
    # NaN fails every comparison (min and max propagate it); an infinity fails the bounds
    return bool(tokens.min() >= 0 and (limits.vocab_size is None or tokens.max() < limits.vocab_size)
                and mask.min() >= 0 and mask.max() <= 1
                and logprobs.min() >= MIN_LOGPROB and logprobs.max() <= 1e-4
                and bool(np.isfinite(rewards).all()) and rewards.min() >= low and rewards.max() <= high
                and max(max(pack.completion_lens) for pack in packs) <= limits.max_completion_tokens
                and all(n <= len(p) + extra or n <= prompt_token_bound(p, extra) for p, n in prompts))


@dataclass
class Quarantine:
    """Splits read groups into trainable and quarantined ones and counts the quarantined records per worker."""

    limits: RecordLimits
    # Records quarantined since the job started, per worker id; an entry that is no group counts as one.
    per_worker: collections.Counter[int] = field(default_factory=collections.Counter)
    since_batch: int = 0  # records quarantined since the last batch was handed out
    workspace: Workspace = field(default_factory=Workspace)  # where a read's groups are joined to be checked

    def split(self, groups: list[StoredGroup]) -> tuple[list[StoredGroup], list[StoredGroup], int]:
        """(good, bad, records quarantined) of ``groups``; the bad ones are counted and logged with their reason.
        The groups that parsed are checked together (:func:`all_fit`); only a read that fails is gone through group
        by group and record by record."""
        parsed = [g for g in groups if g.packed is not None]
        fit = all_fit([g.packed for g in parsed], self.limits, self.workspace)
        if fit and len(parsed) == len(groups):
            return list(groups), [], 0
        suspects = {id(g) for g in groups if not fit or g.packed is None}
        good, bad, counted = [], [], 0
        for stored in groups:
            problem, records = stored_problem(stored, self.limits) if id(stored) in suspects else ("", 0)
            if not problem:
                good.append(stored)
                continue
            self.per_worker[stored.worker_id] += records
            self.since_batch += records
            counted += records
            log.warning("quarantined stream entry %s from worker %s: %s", stored.entry_id, stored.worker_id, problem)
            bad.append(stored)
        return good, bad, counted

    def report(self) -> dict[str, int]:
        """Quarantined records per worker id (JSON keys), for the step report and the checkpoint."""
        return {str(worker): count for worker, count in sorted(self.per_worker.items())}

    def restore(self, saved: dict[str, int]) -> None:
        self.per_worker = collections.Counter({int(worker): int(count) for worker, count in saved.items()})

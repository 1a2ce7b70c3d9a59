"""Audits of the workers' work (beyond the paper; compare TOPLOC in INTELLECT-2, docs/trust.md "Audits").

A worker is a stranger: the site checks that a returned group is well-formed and answers the leased prompt,
but not that its log-probs are those of the snapshot it names, nor that its rewards are the task's. The
learner samples a fraction of the groups it reads (an HMAC of the stream entry id under a key drawn at
start-up, so a worker cannot tell which of its groups will be audited) and

- recomputes the behaviour log-probs of the group's completions under the version the group claims (the
  published snapshot, read back from the learner's own snapshot store, or the base for version 0) and
  compares them with the claimed ones: the mean absolute difference per learning token must be at most
  ``logprob_tolerance`` (same weights, same fp32 arithmetic on the CPU engine: ~1e-6; vLLM in bf16 against
  the learner's fp32: a few 1e-2, hence the default 0.05 and a setting);
- recomputes every record's reward with the task adapter (``TaskAdapter.reward(prompt, completion)``); it
  must match within ``reward_tolerance``.

A group that fails is dropped with every other group of that worker the learner holds and has not trained
(its unaudited records of that window), and the outcome goes to the site with the step report, which
suspends a worker after ``ECHO2_AUDIT_SUSPEND_AFTER`` failures. A group whose version the store no longer
has is counted ``unauditable`` and trained (the store keeps every version within the staleness budget).
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from dataplane.packed import PackedRecords, pack_records
from dataplane.records import TrajectoryGroup
from dataplane.replay import StoredGroup
from dataplane.tasks import TaskAdapter

from .batch import Workspace, collate_packed, concat, token_logprobs

log = logging.getLogger("echo2.learner")

Weights = Callable[[int], "dict[str, torch.Tensor] | None"]


@dataclass(frozen=True)
class AuditSettings:
    fraction: float = 0.05  # of the groups read, per worker in expectation
    logprob_tolerance: float = 0.05  # mean |claimed - recomputed| per learning token
    reward_tolerance: float = 1e-6


def sampled(entry_id: str, *, fraction: float, key: bytes) -> bool:
    """Whether the group of stream entry ``entry_id`` is audited: a keyed hash below ``fraction``."""
    if fraction <= 0:
        return False
    digest = hmac.new(key, entry_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") < fraction * 2**64


def logprob_gap(claimed: torch.Tensor, recomputed: torch.Tensor, mask: torch.Tensor) -> float:
    """Mean absolute difference of the two log-probs over the learning tokens (``mask`` 1): [B, T] each."""
    mask = mask.to(recomputed.dtype)
    return float(((claimed - recomputed).abs() * mask).sum() / mask.sum().clamp(min=1.0))


def reward_problem(group: TrajectoryGroup | PackedRecords, task: TaskAdapter, *, tolerance: float) -> str:
    """The first record whose claimed reward is not the task's, as a reason; "" when all match."""
    packed = group if isinstance(group, PackedRecords) else pack_records(group.records)
    for i, (prompt, completion, claimed) in enumerate(zip(packed.prompts, packed.completions, packed.rewards,
                                                          strict=True)):
        actual = task.reward(prompt, completion)
        if abs(actual - claimed) > tolerance:
            return f"records.{i}.reward: claimed {claimed:.6g}, the task gives {actual:.6g}"
    return ""


@dataclass
class WorkerAudits:
    """One worker's audit outcomes since the last report."""

    passed: int = 0
    failed: int = 0
    dropped_records: int = 0  # records dropped because the worker failed (the failed groups' included)
    reason: str = ""  # the last failure's

    def as_dict(self, worker_id: int) -> dict:
        return {"worker_id": worker_id, "passed": self.passed, "failed": self.failed,
                "dropped_records": self.dropped_records, "reason": self.reason[:500]}


@dataclass
class Auditor:
    """Audits sampled groups against a scoring copy of the policy (never the one being trained)."""

    scorer: torch.nn.Module
    pad_id: int
    task: TaskAdapter
    weights: Weights  # version -> state dict of the snapshot workers got, or None when it is gone
    settings: AuditSettings = field(default_factory=AuditSettings)
    key: bytes = field(default_factory=lambda: os.urandom(32))
    outcomes: dict[int, WorkerAudits] = field(default_factory=lambda: collections.defaultdict(WorkerAudits))
    unauditable: int = 0
    workspace: Workspace = field(default_factory=Workspace)
    _loaded: int | None = None

    def check(self, stored: StoredGroup) -> str | None:
        """Why the group fails its audit, "" when it passes, None when its version cannot be loaded."""
        return self.check_many([stored])[stored.entry_id]

    def check_many(self, groups: list[StoredGroup]) -> dict[str, str | None]:
        """:meth:`check` of every group, by entry id: the rewards one by one, the log-probs in one forward pass
        per claimed version (each version's weights loaded once), which is what makes a sample cheap."""
        verdicts: dict[str, str | None] = {}
        by_version: dict[int, list[StoredGroup]] = collections.defaultdict(list)
        for stored in groups:
            problem = reward_problem(stored.packed, self.task, tolerance=self.settings.reward_tolerance)
            if problem:
                verdicts[stored.entry_id] = problem
            else:
                by_version[stored.version].append(stored)
        for version, same in sorted(by_version.items()):
            if not self._load(version):
                verdicts.update(dict.fromkeys((g.entry_id for g in same), None))
                continue
            verdicts.update(self._logprob_verdicts(version, same))
        return verdicts

    def _logprob_verdicts(self, version: int, groups: list[StoredGroup]) -> dict[str, str]:
        batch = collate_packed(concat(g.packed for g in groups), pad_id=self.pad_id, workspace=self.workspace)
        with torch.no_grad():
            recomputed = token_logprobs(self.scorer, batch)
        out, row = {}, 0
        for stored in groups:
            rows = slice(row, row + stored.size)
            row = rows.stop
            gap = logprob_gap(batch.behaviour_logp[rows], recomputed[rows], batch.token_mask[rows])
            out[stored.entry_id] = "" if gap <= self.settings.logprob_tolerance else (
                f"logprobs: mean |claimed - recomputed| {gap:.4g} per token under v{version} "
                f"> tolerance {self.settings.logprob_tolerance:g}")
        return out

    def verdicts(self, groups: list[StoredGroup]) -> dict[str, str | None]:
        """:meth:`check_many` of the sampled ones of ``groups`` (what :meth:`screen` acts on; it changes nothing, so
        the learner's reader computes it on its own thread while a step trains)."""
        chosen = [g for g in groups if sampled(g.entry_id, fraction=self.settings.fraction, key=self.key)]
        return self.check_many(chosen) if chosen else {}

    def screen(self, groups: list[StoredGroup], verdicts: dict[str, str | None] | None = None,
               ) -> tuple[list[StoredGroup], set[int]]:
        """Audit the sampled ones of ``groups`` (or take their ``verdicts``, from :meth:`verdicts`): (the groups that
        did not fail, the workers that failed)."""
        verdicts = self.verdicts(groups) if verdicts is None else verdicts
        kept, failed = [], set()
        for stored in groups:
            if stored.entry_id not in verdicts:
                kept.append(stored)
                continue
            problem, outcome = verdicts[stored.entry_id], self.outcomes[stored.worker_id]
            if problem is None:
                self.unauditable += 1
                kept.append(stored)
            elif problem:
                outcome.failed += 1
                outcome.reason = problem
                failed.add(stored.worker_id)
                log.warning("audit failed: stream entry %s from worker %s: %s", stored.entry_id, stored.worker_id,
                            problem)
            else:
                outcome.passed += 1
                kept.append(stored)
        return kept, failed

    def dropped(self, worker_id: int, records: int) -> None:
        self.outcomes[worker_id].dropped_records += records

    def report(self) -> list[dict]:
        """The outcomes since the last report (then forgotten): what the step report carries to the site."""
        out = [o.as_dict(w) for w, o in sorted(self.outcomes.items())]
        self.outcomes.clear()
        return out

    def _load(self, version: int) -> bool:
        if self._loaded == version:
            return True
        try:
            state = self.weights(version)
        except Exception as err:  # noqa: BLE001 - weights we cannot read make groups unauditable, never a crash
            log.warning("audit: the weights of v%d cannot be loaded (%s: %s); its groups are not audited", version,
                        type(err).__name__, err)
            state = None
        if state is None:
            return False
        missing, unexpected = self.scorer.load_state_dict(state, strict=False)
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
        if real_missing or unexpected:
            raise ValueError(f"snapshot v{version} does not fit the model: missing={real_missing[:3]} "
                             f"unexpected={unexpected[:3]}")
        self._loaded = version
        return True


def snapshot_weights(store_root, model_dir: str) -> Weights:
    """Weights of a published version from the learner's snapshot store (its full payload: the weights workers
    got, or rebuilt from a delta), the base (version 0) from the job's checkpoint directory; None when the store
    no longer has the version."""
    from dataplane.broadcast.store import full_payload, iter_chunks

    from .snapshots import read_tensors

    base: dict[str, torch.Tensor] = {}

    def weights(version: int) -> dict[str, torch.Tensor] | None:
        if version == 0:
            if not base:
                from transformers import AutoModelForCausalLM

                base.update(AutoModelForCausalLM.from_pretrained(model_dir).state_dict())
            return base
        found = full_payload(store_root, version)
        if found is None:
            return None
        manifest, directory = found
        return read_tensors(list(iter_chunks(directory, manifest)), manifest.chunk_bytes)

    return weights

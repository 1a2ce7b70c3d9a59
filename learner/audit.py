"""Audits of the workers' work (beyond the paper; compare TOPLOC in INTELLECT-2, docs/trust.md "Audits").

A worker is a stranger: the site checks that a returned group is well-formed and answers the leased prompt,
but not that its log-probs are those of the snapshot it names, nor that its rewards are the task's. The
learner

- checks **every** record it reads: its completion text must be its completion token ids decoded as the engines
  decode them (``skip_special_tokens``; each run of equal loss-mask values decoded on its own, since a multi-turn
  episode joins each turn's decoded text and the environment's replies), so the text the reward is computed from
  cannot differ from the ids the policy is trained on;
- samples groups (an HMAC of the stream entry id under a key drawn at start-up, so a worker cannot tell which of
  its groups will be audited) at a rate that starts at 1 for a worker new to the job and falls to the base
  fraction as it passes (:func:`audit_fraction`), and for a sampled group
  - recomputes the behaviour log-probs of the group's completions under the version the group claims (the
    published snapshot, read back from the learner's own snapshot store, or the base for version 0) and compares
    them with the claimed ones: the mean absolute difference per learning token must be at most
    ``logprob_tolerance`` (same weights, same fp32 arithmetic on the CPU engine: ~1e-6; bf16 engines against the
    learner's fp32: a few 1e-2, up to 0.08 under a confident policy, hence the default 0.1 and a setting), and each
    token's within its own allowance, tight where the policy is sure (:func:`logprob_problem`), so a claim near 0
    for every token fails once the policy is confident;
  - recomputes every record's reward with the task adapter (``TaskAdapter.reward(prompt, completion)``); it must
    match within ``reward_tolerance``.

A group that fails is dropped with every other group of that worker the learner holds and has not trained
(its unaudited records of that window), the worker goes back to full audit, and the outcome goes to the site
with the step report, carrying what was checked (:class:`Verdict` evidence: the entry and group, claimed against
recomputed reward and log-prob, the texts that differ), which suspends a worker (and its provider) after
``ECHO2_AUDIT_SUSPEND_AFTER`` failures the site checked (the failed entry is first copied aside in Redis,
:attr:`Auditor.hold`, so the site can hold the report against the group it stored). A group whose version the
store no longer has is counted ``unauditable`` and trained (the store keeps every version within the staleness
budget).
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

from dataplane.packed import PackedRecords, mask_runs, pack_records
from dataplane.records import TrajectoryGroup
from dataplane.replay import StoredGroup
from dataplane.tasks import TaskAdapter

from . import lora
from .batch import Workspace, collate_packed, concat, token_logprobs
from .prompt_audit import Encode, prompt_mismatches

log = logging.getLogger("echo2.learner")

Weights = Callable[[int], "dict[str, torch.Tensor] | None"]
Decode = Callable[[list[list[int]]], list[str]]  # token id sequences -> texts, as the engines decode them

EVIDENCE_FAILED, EVIDENCE_PASSED = 16, 2  # per worker and report: every failure up to 16, a sample of passes
EXCERPT = 48  # characters of a claimed and a decoded text shown around their first difference


@dataclass(frozen=True)
class AuditSettings:
    fraction: float = 0.05  # the base: of a worker's groups past probation (0: no audits at all)
    logprob_tolerance: float = 0.1  # mean |claimed - recomputed| per learning token (bf16 engines: up to 0.08)
    # Per token (:func:`logprob_problem`): |claimed - recomputed| at most ``floor + (1 - p) (nats + tail_nats
    # (1 - p))``, p the recomputed probability; a group fails when more than ``share`` of its learning tokens are
    # outside. bench/bench_logprob_audit.py: the honest bf16 groups used at most 79 % of this allowance, and a
    # constant -0.01 claim failed 54 of 56 (docs/trust.md "Log-prob audits under engine numerics"). ``nats`` under 1
    # also fails a claim near 0 on tokens the policy is fairly sure of: >= 1 would let 0 pass for any p near 1.
    logprob_nats: float = 0.7
    logprob_tail_nats: float = 1.0
    logprob_floor: float = 1e-3
    logprob_share: float = 0.1
    reward_tolerance: float = 1e-6
    probation_groups: int = 16  # a worker's first groups in the job, and after each failure, all audited


def entry_order(entry_id: str) -> tuple[int, int]:
    """A stream entry id as the stream orders it (milliseconds, then sequence)."""
    ms, _, seq = entry_id.partition("-")
    return (int(ms), int(seq or 0)) if ms.isdigit() and (seq or "0").isdigit() else (-1, -1)


def audit_fraction(groups_since_failure: int, *, base: float, probation: int) -> float:
    """The share of a worker's next group to audit, given how many of its groups this learner read since the job
    started or since its last failed audit (probation, docs/trust.md "Audits").

    1 for its first ``probation`` groups; then ``probation / (k + 1)`` for its ``k``-th group, falling to ``base``
    at ``k ~ probation / base`` (320 groups for 16 and 5 %); never below ``base``. Whatever a worker does, each
    group it sends is audited with probability at least ``base``, so a forger is caught after ``(1 - base) /
    base`` forged groups trained on average at most (19 at 5 %); before ``probation`` honest groups, at once."""
    if base <= 0:
        return 0.0
    if groups_since_failure < probation:
        return 1.0
    return max(base, min(1.0, probation / (groups_since_failure + 1)))


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


def logprob_allowance(recomputed: torch.Tensor, *, nats: float, floor: float, tail_nats: float = 0.0) -> torch.Tensor:
    """How far an honest claim of each token's log-prob may be from the learner's ``recomputed`` one: ``floor +
    (1 - p) (nats + tail_nats (1 - p))``, p = exp(recomputed).

    Why that shape: engines differ from the learner's fp32 forward by a small error ``d_j`` on each logit (bf16
    weights and activations, other kernels). A token's log-prob is ``z_i - logsumexp(z)``, so its error is ``d_i -
    sum_j p_j d_j = sum_{j != i} p_j (d_i - d_j)``: at most ``(1 - p_i)`` times the spread of the logit errors. For a
    likely token the others that weigh are its few rivals (``nats``: their spread); for an unlikely one every token
    of weight, the likely ones' large logits with their large bf16 rounding among them (``nats + tail_nats``).
    ``floor`` is the float32 resolution of a log-prob near 0. A token the policy is sure of (p near 1, log-prob near
    0) is allowed almost nothing, so a claim of -0.01 where the truth is -1e-4 is 100 times over, which a mean gap per
    token (the old rule alone) cannot see once most tokens are near 0."""
    slack = -torch.expm1(recomputed.clamp(max=0.0))
    return floor + slack * (nats + tail_nats * slack)


def logprob_problem(claimed: torch.Tensor, recomputed: torch.Tensor, mask: torch.Tensor, *,
                    settings: AuditSettings) -> tuple[str, float]:
    """(why the claimed log-probs of a group are not its policy's, "" when they are; the share of its learning
    tokens outside :func:`logprob_allowance`): [B, T] each, ``mask`` 1 on learning tokens. A group fails when that
    share exceeds ``settings.logprob_share`` (an honest engine's rare near-tie flips stay under it) or its mean gap
    per token exceeds ``settings.logprob_tolerance``."""
    mask = mask.to(recomputed.dtype)
    tokens = float(mask.sum())
    gap = (claimed - recomputed).abs()
    allowed = logprob_allowance(recomputed, nats=settings.logprob_nats, floor=settings.logprob_floor,
                                tail_nats=settings.logprob_tail_nats)
    share = float(((gap > allowed).to(mask.dtype) * mask).sum()) / max(tokens, 1.0)
    mean = float((gap * mask).sum()) / max(tokens, 1.0)
    if share > settings.logprob_share:
        return (f"logprobs: {share:.0%} of {tokens:.0f} tokens off by more than {settings.logprob_floor:g} + "
                f"(1 - p) ({settings.logprob_nats:g} + {settings.logprob_tail_nats:g} (1 - p)) nats (mean |claimed - "
                f"recomputed| {mean:.4g})"), share
    if mean > settings.logprob_tolerance:
        return f"logprobs: mean |claimed - recomputed| {mean:.4g} per token > tolerance " \
               f"{settings.logprob_tolerance:g}", share
    return "", share


def reward_check(packed: PackedRecords, task: TaskAdapter, *, tolerance: float) -> tuple[str, dict]:
    """(the first record whose claimed reward is not the task's as a reason, "" when all match; the evidence:
    that record, or the first, with its claimed and recomputed reward)."""
    first: dict = {}
    for i, (prompt, completion, claimed) in enumerate(zip(packed.prompts, packed.completions, packed.rewards,
                                                          strict=True)):
        actual = task.reward(prompt, completion)
        seen = {"record": i, "claimed_reward": claimed, "recomputed_reward": actual}
        if abs(actual - claimed) > tolerance:
            return f"records.{i}.reward: claimed {claimed:.6g}, the task gives {actual:.6g}", seen
        first = first or seen
    return "", first


def reward_problem(group: TrajectoryGroup | PackedRecords, task: TaskAdapter, *, tolerance: float) -> str:
    """The first record whose claimed reward is not the task's, as a reason; "" when all match."""
    packed = group if isinstance(group, PackedRecords) else pack_records(group.records)
    return reward_check(packed, task, tolerance=tolerance)[0]


def text_mismatches(groups: list[StoredGroup], decode: Decode) -> dict[str, Verdict]:
    """The groups of which a record's completion text is not its completion ids decoded (one ``decode`` call for
    every record of ``groups``), by entry id, each with the first such record and the texts where they differ."""
    pieces, where = [], []
    for stored in groups:
        packed, tok, comp = stored.packed, 0, 0
        for p, c in zip(packed.prompt_lens, packed.completion_lens, strict=True):
            runs = mask_runs(packed.tokens[tok + p:tok + p + c], packed.mask[comp:comp + c])
            pieces.extend(runs)
            where.append(len(runs))
            tok, comp = tok + p + c, comp + c
    texts, out, k, row = decode(pieces) if pieces else [], {}, 0, 0
    for stored in groups:
        for i, claimed in enumerate(stored.packed.completions):
            decoded = "".join(texts[k:k + where[row]])
            k, row = k + where[row], row + 1
            if decoded != claimed and stored.entry_id not in out:
                out[stored.entry_id] = _text_verdict(stored, i, claimed, decoded)
    return out


def _text_verdict(stored: StoredGroup, record: int, claimed: str, decoded: str,
                  what: str = "completion: the text is not its token ids decoded") -> Verdict:
    at = next((j for j, (a, b) in enumerate(zip(claimed, decoded, strict=False)) if a != b),
              min(len(claimed), len(decoded)))
    cut = slice(max(0, at - EXCERPT // 4), max(0, at - EXCERPT // 4) + EXCERPT)
    return Verdict(f"records.{record}.{what} (they differ at character {at})",
                   {**_head(stored), "check": "text", "passed": False, "record": record, "text_at": at,
                    "claimed_text": _printable(claimed[cut]), "decoded_text": _printable(decoded[cut])})


def _printable(text: str) -> str:
    return text.replace("\x00", "\ufffd")  # the site refuses NUL anywhere in a report (PostgreSQL stores none)


def _head(stored: StoredGroup) -> dict:
    packed = stored.packed
    return {"entry_id": stored.entry_id, "group_id": packed.group_ids[0][:200] if packed.group_ids else "",
            "version": stored.version}


@dataclass(frozen=True)
class Verdict:
    """One group's audit: why it failed ("" when it passed) and what was checked (JSON-ready)."""

    problem: str
    evidence: dict


@dataclass
class WorkerAudits:
    """One worker's audit outcomes since the last report."""

    passed: int = 0
    failed: int = 0
    dropped_records: int = 0  # records dropped because the worker failed (the failed groups' included)
    reason: str = ""  # the last failure's
    evidence: list[dict] = field(default_factory=list)  # what was checked: its failures, a few of its passes

    def add(self, verdict: Verdict) -> None:
        if verdict.problem:
            self.failed += 1
            self.reason = verdict.problem
        else:
            self.passed += 1
        kept = sum(e["passed"] == (not verdict.problem) for e in self.evidence)
        if kept < (EVIDENCE_PASSED if not verdict.problem else EVIDENCE_FAILED):
            self.evidence.append(verdict.evidence)

    def as_dict(self, worker_id: int) -> dict:
        return {"worker_id": worker_id, "passed": self.passed, "failed": self.failed,
                "dropped_records": self.dropped_records, "reason": self.reason[:500], "evidence": self.evidence}


@dataclass
class Auditor:
    """Audits the groups read against a scoring copy of the policy (never the one being trained)."""

    scorer: torch.nn.Module
    pad_id: int
    task: TaskAdapter
    weights: Weights  # version -> state dict of the snapshot workers got, or None when it is gone
    decode: Decode  # the job's tokenizer, decoding as the engines do (skip_special_tokens)
    settings: AuditSettings = field(default_factory=AuditSettings)
    key: bytes = field(default_factory=lambda: os.urandom(32))
    outcomes: dict[int, WorkerAudits] = field(default_factory=lambda: collections.defaultdict(WorkerAudits))
    # groups read per worker since it joined (this process's view of the job) or last failed: its probation
    seen: collections.Counter[int] = field(default_factory=collections.Counter)
    unauditable: int = 0
    workspace: Workspace = field(default_factory=Workspace)
    _loaded: int | None = None
    encode: Encode | None = None  # the job's prompt ids of a prompt (dataplane.chat.prompt_ids); None: not checked
    # Copies failed entries aside in Redis before they are dropped (dataplane.audit_hold), so the site can check
    # the report against them (docs/trust.md "Audits the site checks"); None: not held (the site counts none).
    hold: Callable[[list[str]], object] | None = None
    read_through: str = "0-0"  # the newest stream entry counted in ``seen`` (learner/audit_probation.py)

    def check(self, stored: StoredGroup) -> str | None:
        """Why the group fails its audit, "" when it passes, None when its version cannot be loaded."""
        verdict = self.check_many([stored])[stored.entry_id]
        return None if verdict is None else verdict.problem

    def check_many(self, groups: list[StoredGroup]) -> dict[str, Verdict | None]:
        """The full audit of every group, by entry id: the texts, then the rewards one by one and the log-probs in
        one forward pass per claimed version (each version's weights loaded once), which makes a sample cheap."""
        verdicts: dict[str, Verdict | None] = self._texts(groups)
        verdicts.update(self._recompute([g for g in groups if g.entry_id not in verdicts]))
        return verdicts

    def _texts(self, groups: list[StoredGroup]) -> dict[str, Verdict | None]:
        """The checks every group gets: its completions' texts against their ids, its prompt ids against its
        prompt (learner/prompt_audit.py)."""
        out: dict[str, Verdict | None] = dict(text_mismatches(groups, self.decode))
        if self.encode is not None:
            rest = {g.entry_id: g for g in groups if g.entry_id not in out}
            for entry, (claimed, wanted) in prompt_mismatches(list(rest.values()), self.encode).items():
                out[entry] = _text_verdict(rest[entry], 0, claimed, wanted, what="prompt_ids: not the ids the job's "
                                           "prompt format gives its prompt (claimed against the job's, as text)")
        return out

    def _recompute(self, groups: list[StoredGroup]) -> dict[str, Verdict | None]:
        rewards = {g.entry_id: reward_check(g.packed, self.task, tolerance=self.settings.reward_tolerance)
                   for g in groups}
        verdicts: dict[str, Verdict | None] = {}
        by_version: dict[int, list[StoredGroup]] = collections.defaultdict(list)
        for stored in groups:
            by_version[stored.version].append(stored)
        for version, same in sorted(by_version.items()):
            gaps, problems = self._logprob_evidence(version, same) if self._load(version) else ({}, {})
            for stored in same:
                problem, seen = rewards[stored.entry_id]
                found = gaps.get(stored.entry_id)
                evidence = {**_head(stored), **seen, **(found or {})}
                if problem:  # a wrong reward fails whether or not the version can be loaded
                    verdicts[stored.entry_id] = Verdict(problem, {**evidence, "check": "reward", "passed": False})
                elif found is None:
                    verdicts[stored.entry_id] = None
                elif why := problems.get(stored.entry_id):
                    verdicts[stored.entry_id] = Verdict(f"{why} under v{version}",
                                                        {**evidence, "check": "logprobs", "passed": False})
                else:
                    verdicts[stored.entry_id] = Verdict("", {**evidence, "check": "all", "passed": True})
        return verdicts

    def _logprob_evidence(self, version: int, groups: list[StoredGroup]) -> tuple[dict[str, dict], dict[str, str]]:
        """(each group's log-prob evidence, the reason of each that fails :func:`logprob_problem`), by entry id."""
        batch = collate_packed(concat(g.packed for g in groups), pad_id=self.pad_id, workspace=self.workspace)
        with torch.no_grad():
            recomputed = token_logprobs(self.scorer, batch)
        out, problems, row = {}, {}, 0
        for stored in groups:
            rows = slice(row, row + stored.size)
            row = rows.stop
            mask = batch.token_mask[rows].to(recomputed.dtype)
            tokens = float(mask.sum().clamp(min=1.0))
            problem, outside = logprob_problem(batch.behaviour_logp[rows], recomputed[rows], mask,
                                               settings=self.settings)
            if problem:
                problems[stored.entry_id] = problem
            out[stored.entry_id] = {
                "logprob_gap": logprob_gap(batch.behaviour_logp[rows], recomputed[rows], mask),
                "logprob_outside": outside,
                "claimed_logprob": float((batch.behaviour_logp[rows] * mask).sum()) / tokens,
                "recomputed_logprob": float((recomputed[rows] * mask).sum()) / tokens}
        return out, problems

    def verdicts(self, groups: list[StoredGroup]) -> dict[str, Verdict | None]:
        """The text check of every group, and the full audit of the sampled ones (each worker's share by
        :func:`audit_fraction`): what :meth:`screen` acts on. It changes nothing but the probation counts (the
        learner's reader computes it on its own thread while a step trains; never while :meth:`screen` runs)."""
        out: dict[str, Verdict | None] = self._texts(groups)
        chosen = []
        for stored in groups:
            share = audit_fraction(self.seen[stored.worker_id], base=self.settings.fraction,
                                   probation=self.settings.probation_groups)
            self.seen[stored.worker_id] += 1
            self.read_through = max(self.read_through, stored.entry_id, key=entry_order)
            if stored.entry_id not in out and sampled(stored.entry_id, fraction=share, key=self.key):
                chosen.append(stored)
        out.update(self._recompute(chosen) if chosen else {})
        return out

    def screen(self, groups: list[StoredGroup], verdicts: dict[str, Verdict | None] | None = None,
               ) -> tuple[list[StoredGroup], set[int]]:
        """Audit ``groups`` (or take their ``verdicts``, from :meth:`verdicts`): (the groups that did not fail, the
        workers that failed). A worker that failed starts its probation again (full audit)."""
        verdicts = self.verdicts(groups) if verdicts is None else verdicts
        self._hold([g.entry_id for g in groups if (v := verdicts.get(g.entry_id)) is not None and v.problem])
        kept, failed = [], set()
        for stored in groups:
            if stored.entry_id not in verdicts:
                kept.append(stored)
                continue
            verdict = verdicts[stored.entry_id]
            if verdict is None:
                self.unauditable += 1
                kept.append(stored)
                continue
            self.outcomes[stored.worker_id].add(verdict)
            if verdict.problem:
                failed.add(stored.worker_id)
                self.seen[stored.worker_id] = 0
                log.warning("audit failed: stream entry %s from worker %s: %s", stored.entry_id, stored.worker_id,
                            verdict.problem)
            else:
                kept.append(stored)
        return kept, failed

    def _hold(self, entry_ids: list[str]) -> None:
        """Have the failed entries copied aside before they are dropped: the site checks the report against them."""
        if not entry_ids or self.hold is None:
            return
        try:
            self.hold(entry_ids)
        except Exception as err:  # noqa: BLE001 - an entry not held leaves its failure unverified, never a crash
            log.warning("audit: failed entries %s not held for the site (%s: %s): their failures will not count",
                        entry_ids[:3], type(err).__name__, err)

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
        adapter = lora.is_lora(self.scorer)  # a LoRA job: base + the version's adapter (v0: the base alone)
        try:
            state = {} if adapter and version == 0 else self.weights(version)
        except Exception as err:  # noqa: BLE001 - weights we cannot read make groups unauditable, never a crash
            log.warning("audit: the weights of v%d cannot be loaded (%s: %s); its groups are not audited", version,
                        type(err).__name__, err)
            state = None
        if state is None:
            return False
        if adapter:
            lora.load_adapter(self.scorer, state)
            self._loaded = version
            return True
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

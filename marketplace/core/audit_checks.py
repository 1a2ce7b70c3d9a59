"""The site's own check of one failed audit the learner reported (docs/trust.md "Audits the site checks").

A learner's "failed" is the word of the job's owner about a stranger's worker, so the site checks it against what
it holds itself: the group it accepted from the worker (the stream entry, or the copy held when the learner dropped
it: ``dataplane.audit_hold``) and the job's task. Each reported failure gets one :class:`SiteCheck`:

- ``refused``: the stored entry's seal is not the site's (``dataplane.seal``: a record the learner wrote into the
  job's Redis itself, in the stream or in a hold, or one altered after the site sealed it), or the evidence does not
  describe the stored group (another worker's entry, another group or version,
  a record it does not have, claimed figures that are not the worker's, the same entry reported twice), or the
  site recomputed the reward (or decoded the text) and the worker's is right. A forged report: logged, never counted.
- ``verified``: a reward failure the site re-scored itself with the job's task: the worker's claimed reward is
  not the task's; or a text failure whose sealed ids the site decoded with the job's tokenizer (version 0's, as
  the workers decode: :func:`decoded_verdict`) to another text than the worker's. Counted toward suspension in
  full: no learner can make a right reward or text look wrong.
- ``consistent``: a log-prob failure whose evidence matches the stored group, which the site cannot recompute (it
  holds no model); a text failure whose claimed text is the worker's, until the site decoded it (off the request
  path: services/audit_texts.py), and after, where the tokenizer could not be had or the record is multi-turn.
  Counted only when learners of several owners say so (:func:`counted_failures`).
- ``unverified``: the site cannot check it: the entry is gone (acknowledged and no held copy left) or carries no
  seal (stored before the site sealed groups), the failure
  came without evidence, the task runs code the site does not run (a user reward function, a verifiers
  environment, a task of an installed package) or needs what the site lacks (a data set's rows, a scorer's
  package), or a log-prob gap under the site's floor. Stored and shown, never counted on the learner's word alone.

Plain functions over the stored group and the evidence dict: no Django, no Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from dataplane.packed import mask_runs
from dataplane.seal import SEAL_FIELD, seal_valid
from dataplane.stored import StoredGroup, field
from dataplane.tasks import BUILTIN, TaskAdapter, build_task

VERIFIED, CONSISTENT, UNVERIFIED, REFUSED = "verified", "consistent", "unverified", "refused"
REWARD_TOLERANCE = 1e-6  # the learner's (learner/audit.py AuditSettings.reward_tolerance)
LOGPROB_FLOOR = 0.05  # the smallest mean |claimed - recomputed| per token the site takes as a failure: the learner's
# default tolerance, above what vLLM in bf16 drifts from fp32 (a few 1e-2); a learner set tighter fails honest workers
LOGPROB_SHARE = 0.1  # the learner's default share of tokens past its per-token allowance (learner/audit.py
# AuditSettings.logprob_share): a failure past it stands on the per-token rule, whatever its mean gap
EXCERPT, LEAD = 48, 12  # the learner's text excerpt: 48 characters from 12 before the first difference
USER_CODE_TASKS = frozenset({"verifiers"})  # built-in tasks that run the job's own code (an environment it names)


@dataclass(frozen=True)
class SiteCheck:
    status: str  # VERIFIED, CONSISTENT, UNVERIFIED or REFUSED
    why: str

    def as_dict(self) -> dict[str, str]:
        return {"site": self.status, "site_reason": self.why[:300]}


def site_scorer(task_spec: Any) -> tuple[TaskAdapter | None, str]:
    """(the job's task built to score at the site, "") or (None, why the site cannot score it). Only built-in tasks
    whose reward is the site's own code: never a user function, an environment, or a task of an installed package."""
    name = task_spec.get("name") if isinstance(task_spec, dict) else None
    if name not in BUILTIN or name in USER_CODE_TASKS:
        return None, f"task {name!r} runs code the site does not run (user-code task): its rewards are not re-scored"
    if name == "dataset":
        reward = task_spec.get("reward")
        functions = reward.get("functions", []) if isinstance(reward, dict) else \
            (reward if isinstance(reward, list) else [reward])
        named = [f.get("function") if isinstance(f, dict) else f for f in functions]
        if any(isinstance(f, str) and ":" in f for f in named):
            return None, "task 'dataset' scores with a user reward function the site does not run: not re-scored"
    try:
        task = build_task(task_spec)
        task.prepare(allow_user_code=False)
    except Exception as err:  # noqa: BLE001 - whatever stops the site scoring leaves the failure unverified
        return None, f"the site cannot score task {name!r} ({type(err).__name__}: {str(err)[:160]})"
    return task, ""


def seal_verdict(fields: Mapping, *, entry: str, job_id: int, keys: Sequence[bytes]) -> SiteCheck | None:
    """None when the stored entry ``fields`` (held copy or stream entry, as stored) carry the site's valid seal for
    job ``job_id`` under one of ``keys``; otherwise the verdict that stands instead of any check of its content:
    no seal is ``unverified`` (an entry appended before the site sealed groups, or written without one: believed
    either way in nothing), a seal that does not match is ``refused`` (written by another hand, or altered)."""
    claimed = field(fields, SEAL_FIELD)
    if claimed is None:
        return SiteCheck(UNVERIFIED, f"entry {entry} carries no seal of the site (stored before groups were sealed, "
                                     "or not by the site): its content is not believed")
    worker, lease, data = (field(fields, name) for name in ("worker_id", "lease_id", "data"))
    worker, lease = _decoded(worker), _decoded(lease)  # anyone's bytes: decoded without raising
    data = data.encode() if isinstance(data, str) else data
    well_formed = worker.isascii() and worker.isdigit() and data is not None
    if not well_formed or not seal_valid(keys, claimed, job_id=job_id, worker_id=int(worker), lease_id=lease,
                                         data=data):
        return SiteCheck(REFUSED, f"entry {entry}'s seal is not the site's: a record the site never stored (written "
                                  "into the job's Redis by another hand) or altered after it was sealed")
    return None


def _decoded(value: bytes | str | None) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else (value or "")


def check_failure(evidence: Mapping[str, Any], stored: StoredGroup | None, *, worker_id: int,
                  scorer: TaskAdapter | None, scorer_problem: str) -> SiteCheck:
    """The site's verdict on one failure the learner reported of ``worker_id``, from its ``evidence`` and the group
    the site stored under that entry (None: gone)."""
    entry = evidence.get("entry_id", "")
    if stored is None:
        return SiteCheck(UNVERIFIED, f"record gone: entry {entry} is no longer in the job's stream nor held")
    if stored.worker_id != worker_id:
        return SiteCheck(REFUSED, f"entry {entry} was accepted from worker {stored.worker_id}, not {worker_id}")
    packed = stored.packed
    if packed is None:
        return SiteCheck(REFUSED, f"entry {entry} is no group ({stored.problem})")
    group_id = packed.group_ids[0][:200] if packed.group_ids else ""
    if evidence.get("group_id", "") != group_id or evidence.get("version") != stored.version:
        return SiteCheck(REFUSED, f"entry {entry} holds group {group_id!r} v{stored.version}, not the reported "
                                  f"{evidence.get('group_id', '')!r} v{evidence.get('version')}")
    record = evidence.get("record", 0)
    if not 0 <= record < len(packed):
        return SiteCheck(REFUSED, f"entry {entry} has {len(packed)} records, no record {record}")
    check = evidence.get("check")
    if check == "reward":
        return _reward(evidence, stored, record, scorer, scorer_problem)
    if check == "logprobs":
        return _logprobs(evidence, stored)
    if check == "text":
        return _text(evidence, stored, record)
    return SiteCheck(REFUSED, f"check {check!r} is no failure")


def _reward(evidence, stored: StoredGroup, record: int, scorer: TaskAdapter | None, problem: str) -> SiteCheck:
    packed = stored.packed
    stored_reward = packed.rewards[record]
    claimed = evidence.get("claimed_reward")
    if claimed is None or not math.isclose(claimed, stored_reward, rel_tol=1e-9, abs_tol=1e-9):
        return SiteCheck(REFUSED, f"record {record}'s claimed reward is {stored_reward:.6g}, the report says {claimed}")
    if scorer is None:
        return SiteCheck(UNVERIFIED, problem)
    try:
        actual = float(scorer.reward(packed.prompts[record], packed.completions[record]))
    except Exception as err:  # noqa: BLE001 - a task that fails at the site cannot confirm anything
        return SiteCheck(UNVERIFIED, f"the site's scoring failed ({type(err).__name__}: {str(err)[:120]})")
    if abs(actual - stored_reward) > REWARD_TOLERANCE:
        return SiteCheck(VERIFIED, f"re-scored by the site: record {record} claims {stored_reward:.6g}, the task "
                                   f"gives {actual:.6g}")
    return SiteCheck(REFUSED, f"re-scored by the site: record {record}'s reward {stored_reward:.6g} is the task's")


def claimed_logprob(stored: StoredGroup) -> float:
    """The group's claimed log-prob per learning token, as the learner's evidence states it (learner/audit.py)."""
    packed = stored.packed
    mask = [float(m) for m in packed.mask]
    tokens = max(sum(mask), 1.0)
    return math.fsum(lp * m for lp, m in zip(packed.logprobs, mask, strict=True)) / tokens


def _logprobs(evidence, stored: StoredGroup) -> SiteCheck:
    claimed, recomputed, gap = (evidence.get(k) for k in ("claimed_logprob", "recomputed_logprob", "logprob_gap"))
    if claimed is None or recomputed is None or gap is None:
        return SiteCheck(UNVERIFIED, "log-prob failure without its claimed and recomputed figures")
    ours = claimed_logprob(stored)
    if not math.isclose(claimed, ours, rel_tol=1e-4, abs_tol=1e-4):
        return SiteCheck(REFUSED, f"the worker claimed {ours:.6g} per learning token, the report says {claimed:.6g}")
    if recomputed > 1e-6 or gap + 1e-4 < abs(claimed - recomputed):
        return SiteCheck(REFUSED, f"impossible figures: recomputed {recomputed:.6g} per token with a mean gap of "
                                  f"{gap:.4g} against the claimed {claimed:.6g}")
    outside = evidence.get("logprob_outside") or 0.0
    if gap < LOGPROB_FLOOR and outside <= LOGPROB_SHARE:
        return SiteCheck(UNVERIFIED, f"log-prob gap {gap:.4g} under the site's floor {LOGPROB_FLOOR:g}, and "
                                     f"{outside:.0%} of tokens past the per-token allowance")
    return SiteCheck(CONSISTENT, f"the claimed log-probs are the worker's; the learner's recomputation (gap "
                                 f"{gap:.4g} per token, {outside:.0%} of tokens past the allowance) cannot be "
                                 "repeated at the site")


def _text(evidence, stored: StoredGroup, record: int) -> SiteCheck:
    claimed, decoded, at = evidence.get("claimed_text"), evidence.get("decoded_text"), evidence.get("text_at")
    if claimed is None or decoded is None or at is None:
        return SiteCheck(UNVERIFIED, "text failure without its texts")
    if claimed == decoded:
        return SiteCheck(REFUSED, "the claimed and decoded texts are the same")
    if not text_parts(evidence, stored, record):
        return SiteCheck(REFUSED, f"the claimed text is not record {record}'s at character {at}")
    return SiteCheck(CONSISTENT, TEXT_PENDING)


TEXT_PENDING = "the claimed text is the worker's; the site decodes its ids with the job's tokenizer next"
COMPLETION, PROMPT = "completion", "prompt"
Decode = Callable[[list[list[int]]], list[str]]  # token id sequences -> texts, as the engines decode them
Encode = Callable[[str], list[int]]  # prompt text -> the job's prompt ids (dataplane.chat.prompt_ids)


def text_parts(evidence: Mapping[str, Any], stored: StoredGroup, record: int) -> list[str]:
    """Which texts of the stored group a text failure's claimed excerpt is: the record's completion (its text against
    its ids), the group's prompt ids written as text (the prompt check: learner/prompt_audit.py); none, one, or
    (a completion written as the prompt's ids) both."""
    claimed, at = evidence.get("claimed_text"), evidence.get("text_at") or 0
    packed, start = stored.packed, max(0, at - LEAD)
    prompt_ids = " ".join(map(str, packed.tokens[:packed.prompt_lens[0]]))  # the prompt check's claimed "text"
    texts = {COMPLETION: packed.completions[record].replace("\x00", "\ufffd"), PROMPT: prompt_ids}
    return [part for part, text in texts.items() if claimed == text[start:start + EXCERPT]]


def one_turn_task(task_spec: Any) -> bool:
    """Whether the job's task is a built-in one-turn task: its records' text is the engine's decoding of all its
    completion ids at once. A multi-turn task's text joins the environment's replies, which are text to begin with;
    a user-code task may be either."""
    name = task_spec.get("name") if isinstance(task_spec, dict) else None
    return name in BUILTIN and name not in USER_CODE_TASKS and not BUILTIN[name].multi_turn


def text_item(stored: StoredGroup, record: int, parts: list[str], *, one_turn: bool) -> dict[str, Any]:
    """What :func:`decoded_verdict` needs of the sealed group, as plain JSON (it runs beside the tokenizer, in a
    process of its own: infra/job_tokenizer.py)."""
    packed, tok, comp = stored.packed, 0, 0
    for p, c in zip(packed.prompt_lens[:record], packed.completion_lens[:record], strict=True):
        tok, comp = tok + p + c, comp + c
    p, c = packed.prompt_lens[record], packed.completion_lens[record]
    return {"parts": parts, "record": record, "one_turn": one_turn, "completion": packed.completions[record],
            "completion_ids": list(packed.tokens[tok + p:tok + p + c]), "mask": list(packed.mask[comp:comp + c]),
            "prompt": packed.prompts[0], "prompt_ids": list(packed.tokens[:packed.prompt_lens[0]])}


def decoded_verdict(item: Mapping[str, Any], *, decode: Decode, encode: Encode) -> SiteCheck:
    """The site's verdict on a text failure whose claimed text is the worker's (``item``: :func:`text_item`), with
    the job's tokenizer (``decode``, ``encode``: version 0's, as the workers use it): of each text the claimed
    excerpt is, the first verdict that is not ``refused``, else ``refused``.

    - The prompt check: the group's prompt ids are not those of its prompt (``encode``): ``verified``; they are:
      ``refused`` (the learner's own check passes them).
    - A completion: decoded as the learner does (each run of equal loss-mask values on its own, joined), equal to
      the worker's text: ``refused``. Otherwise ``verified`` where an honest engine's text is exactly its ids
      decoded: a record that is all generated tokens (mask all 1), or any record of a one-turn task (decoded
      whole, as its engine did). A multi-turn record stays ``consistent``: its environment replies are text the
      environment wrote, which a tokenizer need not decode back to exactly, so an honest one could differ."""
    verdicts = [(_prompt_verdict if part == PROMPT else _completion_verdict)(item, decode=decode, encode=encode)
                 for part in item["parts"]]
    return next((v for v in verdicts if v.status != REFUSED), verdicts[0] if verdicts else
                SiteCheck(REFUSED, "the claimed text is none of the record's"))


def _prompt_verdict(item: Mapping[str, Any], *, decode: Decode, encode: Encode) -> SiteCheck:
    wanted = list(encode(item["prompt"]))
    if wanted == item["prompt_ids"]:
        return SiteCheck(REFUSED, "checked by the site with the job's tokenizer: the group's prompt ids are its "
                                  "prompt's under the job's prompt format; the report is false")
    return SiteCheck(VERIFIED, f"checked by the site with the job's tokenizer: the group's prompt ids "
                               f"({len(item['prompt_ids'])}) are not its prompt's ({len(wanted)} ids)")


def _completion_verdict(item: Mapping[str, Any], *, decode: Decode, encode: Encode) -> SiteCheck:
    record = item["record"]
    ids, mask, claimed = item["completion_ids"], item["mask"], item["completion"]
    runs = mask_runs(ids, mask)
    single = len(runs) == 1
    texts = decode(runs if single or not item["one_turn"] else [*runs, list(ids)])
    if "".join(texts[:len(runs)]) == claimed:
        return SiteCheck(REFUSED, f"decoded by the site with the job's tokenizer: record {record}'s text is its ids "
                                  "decoded; the report is false")
    whole = texts[0] if single else (texts[-1] if item["one_turn"] else None)
    if whole is not None and whole != claimed and (single and all(m == 1 for m in mask) or item["one_turn"]):
        at = next((j for j, (a, b) in enumerate(zip(claimed, whole, strict=False)) if a != b),
                  min(len(claimed), len(whole)))
        return SiteCheck(VERIFIED, f"decoded by the site with the job's tokenizer: record {record}'s text is not its "
                                   f"ids decoded (they differ at character {at}: {claimed[at:at + 24]!r} against "
                                   f"{whole[at:at + 24]!r})")
    why = ("its ids decoded whole are its text (only the learner's per-run rule differs)" if whole == claimed else
           "a multi-turn record's environment replies need not decode back to their text exactly")
    return SiteCheck(CONSISTENT, f"decoded by the site with the job's tokenizer: record {record}'s text is not its "
                                 f"ids decoded run by run, but {why}: not counted")


def counted_failures(verified: int, consistent_owners: Iterable[int], *, owners_needed: int) -> int:
    """The failures that count toward a worker's suspension: every one the site verified, plus one per distinct job
    owner whose learner reported a consistent (log-prob or text) failure of it, once at least ``owners_needed``
    distinct owners have. A single owner (forging, or honest) never adds more than one, and none on his own."""
    owners = len(set(consistent_owners))
    return verified + (owners if owners_needed and owners >= owners_needed else 0)  # 0 needed: never

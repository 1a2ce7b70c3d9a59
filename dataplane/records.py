"""The trajectory record tau = (x, y, r, v, Omega) of the paper (section 4.1, appendix F.1).

A record is what a worker returns for one sampled completion: the prompt ``x`` (text and token ids),
the completion ``y`` (token ids and the behaviour policy's per-token log-probs), the scalar reward
``r``, the snapshot version ``v`` the worker really generated under, and task metadata ``Omega``
(group id, lease id, optional loss mask).

A worker returns the ``n`` records of one leased prompt together, as one :class:`TrajectoryGroup`: GRPO
learns from whole groups. The group is the one shape a trajectory has on its whole way: the agent builds
it, the websocket message carries it, the site validates it once (its schema and group rules here, then
against the job and the lease), the replay buffer stores it as JSON, and the learner reads it back in columns
(``dataplane/packed.py``: what it trains on, checked again without a pydantic object per record). A malformed group
is rejected with a reason, never silently dropped.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import orjson
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from .strict import StrictModel

MAX_TOKENS = 65_536
MAX_GROUP = 4096
#: Special tokens an engine may add to a prompt's own tokens (a BOS, a chat template's markers).
PROMPT_SPECIAL_TOKENS = 16
#: The largest reward magnitude any task may declare: far inside float32, so a group's mean, square and
#: std stay finite in the learner's advantage (a reward of 1e308 is finite in Python and inf in float32).
MAX_REWARD = 1e6
#: The lowest behaviour log-prob a record may carry: a sampled token's log-prob is far above it, and the
#: learner's float32 ratio ``exp(logp - behaviour)`` would overflow well below it.
MIN_LOGPROB = -1e4
#: The most bytes of JSON a record's task metadata (Omega) may take: our tasks write a few dozen (the sandbox's
#: ``{"turns": 3}``); padding there grew a group from under 2 KB to 7 MiB. The site's setting
#: ``ECHO2_MAX_RECORD_METADATA_BYTES`` may change it.
MAX_METADATA_BYTES = 1024


class RecordError(ValueError):
    """A trajectory record that violates the schema; ``str(err)`` is the reason given to the sender."""


def _finite_at_most(values: list[float], high: float, low: float = -math.inf) -> bool:
    """Whether every value is finite and within ``[low, high]``. A finite sum means no NaN or infinity (both
    propagate), and then min and max are exact; only a sum that overflowed is checked value by value."""
    if not values:
        return True
    if math.isfinite(sum(values)):
        return low <= min(values) and max(values) <= high
    return all(math.isfinite(v) and low <= v <= high for v in values)


class Trajectory(BaseModel):
    """One version-tagged, rewarded completion."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: int = Field(ge=1, description="Job the record belongs to.")
    lease_id: str = Field(min_length=1, max_length=64, description="Prompt lease this completion answers.")
    group_id: str = Field(min_length=1, max_length=64, description="GRPO group: completions of one prompt.")
    prompt: str = Field(max_length=100_000, description="x: the prompt text.")
    prompt_ids: list[int] = Field(min_length=1, max_length=MAX_TOKENS, description="x as token ids.")
    completion: str = Field(max_length=100_000, description="y: the decoded completion.")
    completion_ids: list[int] = Field(min_length=1, max_length=MAX_TOKENS, description="y as token ids.")
    logprobs: list[float] = Field(description="Behaviour policy log-prob of each completion token.")
    reward: float = Field(description="r = R(x, y), computed by the worker's task adapter.")
    version: int = Field(ge=0, description="v: snapshot version installed when y was generated.")
    loss_mask: list[int] | None = Field(default=None, description="1 where a completion token learns.")
    metadata: dict[str, Any] = Field(default_factory=dict, description="Omega: task metadata.")

    @model_validator(mode="after")
    def _consistent(self) -> Trajectory:
        n = len(self.completion_ids)
        if len(self.logprobs) != n:
            raise ValueError(f"logprobs has {len(self.logprobs)} entries for {n} completion tokens")
        if self.loss_mask is not None and len(self.loss_mask) != n:
            raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} completion tokens")
        problem = value_problem(self)
        if problem:
            raise ValueError(problem)
        return self


def value_problem(rec: Trajectory | Any) -> str:
    """What the schema refuses in the values of a record whose lengths match (one line), or "": negative token
    ids, a reward that is not finite, log-probs not finite or above 0, loss-mask entries other than 0 and 1.
    Also the learner's record-by-record check of what it read back in columns (``dataplane.packed``).
    min/max/sum run in C: a 640-token record is checked in microseconds, not a Python loop per token."""
    if min(rec.prompt_ids) < 0 or min(rec.completion_ids) < 0:
        return "token ids must be non-negative"
    if not math.isfinite(rec.reward):
        return "reward must be a finite number"
    if not _finite_at_most(rec.logprobs, 1e-4):
        return "logprobs must be finite and <= 0"
    if rec.loss_mask is not None and len(rec.loss_mask) and (min(rec.loss_mask) < 0 or max(rec.loss_mask) > 1):
        return "loss_mask entries must be 0 or 1"
    return ""


#: The most errors a group may report of its reward functions: each of a reward's (at most 16) functions failing on
#: each record (``dataplane/rewards``).
MAX_REWARD_ERRORS = 16 * MAX_GROUP


class RewardErrors(StrictModel):
    """What the task's reward functions did wrong while scoring a group's records (docs/rewards.md): ``errors``
    (records a function failed to score: it raised), ``non_finite`` (records it scored NaN, an infinity or beyond
    the bound), ``last_error`` (the latest, one short line). Each record so scored got the function's fallback. The
    agent counts them (``dataplane.rewards.RewardStats``); the site adds up the groups it accepts, per job."""

    model_config = ConfigDict(frozen=True)  # and strict.StrictModel's: no unknown key or NUL in last_error

    errors: int = Field(default=0, ge=0, le=MAX_REWARD_ERRORS)
    non_finite: int = Field(default=0, ge=0, le=MAX_REWARD_ERRORS)
    last_error: str = Field(default="", max_length=200)


class TrajectoryGroup(BaseModel):
    """The ``n`` completions of one leased prompt, all generated under one installed snapshot version.

    The group rules: at least one record; every record names the group's job, lease and group and
    carries its version (a worker never mixes versions within a group); every record answers the same
    prompt. Whether the group is the right size, the version was published and the lease is still the
    worker's is checked against the job and the lease by the site (``check_for_job`` and the replay buffer).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    job_id: int = Field(ge=1, description="Job the group belongs to.")
    lease_id: str = Field(min_length=1, max_length=64, description="Prompt lease the group answers.")
    group_id: str = Field(min_length=1, max_length=64, description="GRPO group id of the leased prompt.")
    version: int = Field(ge=0, description="v: snapshot version installed while the group was generated.")
    records: list[Trajectory] = Field(min_length=1, max_length=MAX_GROUP, description="The n completions.")
    reward_errors: RewardErrors | None = Field(default=None, description="What the task's reward functions did "
                                               "wrong scoring these records; none: nothing.")

    @model_validator(mode="after")
    def _one_group(self) -> TrajectoryGroup:
        first = self.records[0]
        for i, rec in enumerate(self.records):
            for name in ("job_id", "lease_id", "group_id", "version"):
                if getattr(rec, name) != getattr(self, name):
                    raise ValueError(f"records.{i}.{name}: {getattr(rec, name)!r} differs from the group's "
                                     f"{getattr(self, name)!r}")
            if rec.prompt_ids != first.prompt_ids or rec.prompt != first.prompt:
                raise ValueError(f"records.{i}.prompt: differs from the rest of the group")
        return self

    @classmethod
    def of(cls, records: list[Trajectory]) -> TrajectoryGroup:
        """The group of ``records`` (its job, lease, group and version read off the first)."""
        if not records:
            raise RecordError("records: a group needs at least one record")
        first = records[0]
        return cls(job_id=first.job_id, lease_id=first.lease_id, group_id=first.group_id, version=first.version,
                   records=records)

    def check_for_job(self, *, job_id: int, group_size: int, max_version: int,
                      limits: RecordLimits | None = None) -> None:
        """Raise :class:`RecordError` unless the group fits the job: its id, its ``n``, a published version,
        and every record within the job's ``limits`` (:func:`group_problem`)."""
        if self.job_id != job_id:
            raise RecordError(f"job_id: group is for job {self.job_id}, not job {job_id}")
        if len(self.records) != group_size:
            raise RecordError(f"records: a group needs {group_size} records, got {len(self.records)}")
        if self.version > max_version:
            raise RecordError(f"version: {self.version} was never published (latest is {max_version})")
        problem = group_problem(self, limits or RecordLimits())
        if problem:
            raise RecordError(problem)


@dataclass(frozen=True)
class RecordLimits:
    """What a job's model and task allow a record to hold, beyond the schema.

    The schema cannot know the model or the task; these bounds can, and they are what keeps one bad record
    from crashing or poisoning the learner: a token id past the vocabulary is an IndexError in the
    embedding, a reward or log-prob outside float32's comfortable range turns the advantages into NaN.
    The site checks them when a group is returned; the learner checks them again on what it reads
    (a stream may hold entries the site never checked: written before these checks, or by hand).
    """

    vocab_size: int | None = None  # the model's embedding rows; None until the learner reported it
    max_completion_tokens: int = MAX_TOKENS  # the task's budget for one completion (TaskAdapter)
    reward_range: tuple[float, float] = (-MAX_REWARD, MAX_REWARD)  # the task's declared range
    max_metadata_bytes: int = MAX_METADATA_BYTES  # a record's metadata as JSON (the site's setting)
    # token ids the job's prompt format adds to a prompt's own (``PromptFormat.token_allowance``: a chat template)
    prompt_extra_tokens: int = PROMPT_SPECIAL_TOKENS


def prompt_token_bound(prompt: str, extra: int = PROMPT_SPECIAL_TOKENS) -> int:
    """The most token ids an honest engine makes of ``prompt``: no tokenizer needs more than one token per
    UTF-8 byte (byte-level BPE, byte fallback), plus ``extra``: a few special tokens, or what the job's chat
    template and system prompt add (``RecordLimits.prompt_extra_tokens``). Needs no tokenizer, so the site can
    check it; the prompt text itself was checked against the lease."""
    return len(prompt.encode("utf-8")) + extra


def record_problem(rec: Trajectory, limits: RecordLimits) -> str:
    """Why ``rec`` breaks ``limits`` (one line, ``field: why``), or "" when it fits."""
    return prompt_problem(rec, limits) or completion_problem(rec, limits)


def prompt_problem(rec: Trajectory, limits: RecordLimits) -> str:
    """What :func:`record_problem` finds in ``rec``'s prompt (its token count for its text, ids in the vocabulary)."""
    if len(rec.prompt_ids) > prompt_token_bound(rec.prompt, limits.prompt_extra_tokens):
        return (f"prompt_ids: {len(rec.prompt_ids)} tokens for a prompt of {len(rec.prompt.encode('utf-8'))} "
                f"bytes (at most {prompt_token_bound(rec.prompt, limits.prompt_extra_tokens)})")
    if limits.vocab_size is not None and (top := max(rec.prompt_ids)) >= limits.vocab_size:
        return f"prompt_ids: token id {top} is not in the model's vocabulary of {limits.vocab_size}"
    return ""


def completion_problem(rec: Trajectory, limits: RecordLimits) -> str:
    """What :func:`record_problem` finds in the rest of ``rec``: its completion's length and ids, reward, log-probs."""
    if len(rec.completion_ids) > limits.max_completion_tokens:
        return (f"completion_ids: {len(rec.completion_ids)} tokens, the job allows at most "
                f"{limits.max_completion_tokens}")
    if limits.vocab_size is not None and (top := max(rec.completion_ids)) >= limits.vocab_size:
        return f"completion_ids: token id {top} is not in the model's vocabulary of {limits.vocab_size}"
    low, high = limits.reward_range
    if not (math.isfinite(rec.reward) and low <= rec.reward <= high):
        return f"reward: {rec.reward!r} is outside the task's range [{low:g}, {high:g}]"
    if not _finite_at_most(rec.logprobs, 1e-4, MIN_LOGPROB):
        return f"logprobs: must be finite and within [{MIN_LOGPROB:g}, 0]"
    return ""


def metadata_problem(rec: Trajectory, limits: RecordLimits) -> str:
    """Why ``rec``'s metadata is too big for ``limits`` (``metadata: why``), or "". Measured as compact JSON."""
    if not rec.metadata:  # most records carry none
        return ""
    try:
        size = len(orjson.dumps(rec.metadata))
    except TypeError:  # an integer past 64 bits: the standard library writes it
        size = len(json.dumps(rec.metadata, separators=(",", ":"), ensure_ascii=False).encode())
    if size > limits.max_metadata_bytes:
        return f"metadata: {size} bytes of JSON, a record's metadata may take at most {limits.max_metadata_bytes}"
    return ""


def group_problem(group: TrajectoryGroup, limits: RecordLimits) -> str:
    """The first record of ``group`` that breaks ``limits``, as ``records.i.field: why``; "" when all fit. The
    group's size follows: its ``n`` records (``check_for_job``), each of a prompt the lease gave and at most the
    task's completion tokens, and of metadata within its cap (:func:`metadata_problem`). The records share one
    prompt (the group's rule, checked when it was parsed), so the prompt is checked once, on the first."""
    problem = prompt_problem(group.records[0], limits)
    if problem:
        return f"records.0.{problem}"
    for i, rec in enumerate(group.records):
        problem = completion_problem(rec, limits) or metadata_problem(rec, limits)
        if problem:
            return f"records.{i}.{problem}"
    return ""


def error_reason(err: ValidationError, *, default: str = "record") -> str:
    """Pydantic's first error as one line, ``where: why``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or default
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"

"""The trajectory record tau = (x, y, r, v, Omega) of the paper (section 4.1, appendix F.1).

A record is what a worker returns for one sampled completion: the prompt ``x`` (text and token ids),
the completion ``y`` (token ids and the behaviour policy's per-token log-probs), the scalar reward
``r``, the snapshot version ``v`` the worker really generated under, and task metadata ``Omega``
(group id, lease id, optional loss mask).

A worker returns the ``n`` records of one leased prompt together, as one :class:`TrajectoryGroup`: GRPO
learns from whole groups. The group is the one shape a trajectory has on its whole way: the agent builds
it, the websocket message carries it, the site validates it once (its schema and group rules here, then
against the job and the lease), the replay buffer stores it as JSON, and the learner reads it back with
``TrajectoryGroup.model_validate_json``. A malformed group is rejected with a reason, never silently dropped.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_TOKENS = 65_536
MAX_GROUP = 4096


class RecordError(ValueError):
    """A trajectory record that violates the schema; ``str(err)`` is the reason given to the sender."""


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
        if any(t < 0 for t in self.prompt_ids) or any(t < 0 for t in self.completion_ids):
            raise ValueError("token ids must be non-negative")
        if not math.isfinite(self.reward):
            raise ValueError("reward must be a finite number")
        if any(not math.isfinite(lp) or lp > 1e-4 for lp in self.logprobs):
            raise ValueError("logprobs must be finite and <= 0")
        if self.loss_mask is not None:
            if len(self.loss_mask) != n:
                raise ValueError(f"loss_mask has {len(self.loss_mask)} entries for {n} completion tokens")
            if any(m not in (0, 1) for m in self.loss_mask):
                raise ValueError("loss_mask entries must be 0 or 1")
        return self


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

    def check_for_job(self, *, job_id: int, group_size: int, max_version: int) -> None:
        """Raise :class:`RecordError` unless the group fits the job: its id, its ``n``, a published version."""
        if self.job_id != job_id:
            raise RecordError(f"job_id: group is for job {self.job_id}, not job {job_id}")
        if len(self.records) != group_size:
            raise RecordError(f"records: a group needs {group_size} records, got {len(self.records)}")
        if self.version > max_version:
            raise RecordError(f"version: {self.version} was never published (latest is {max_version})")


def error_reason(err: ValidationError, *, default: str = "record") -> str:
    """Pydantic's first error as one line, ``where: why``."""
    first = err.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or default
    return f"{where}: {first['msg'].removeprefix('Value error, ')}"

"""The trajectory record tau = (x, y, r, v, Omega) of the paper (section 4.1, appendix F.1).

A record is what a worker returns for one sampled completion: the prompt ``x`` (text and token ids),
the completion ``y`` (token ids and the behaviour policy's per-token log-probs), the scalar reward
``r``, the snapshot version ``v`` the worker really generated under, and task metadata ``Omega``
(group id, lease id, optional loss mask). The site validates every record before it reaches the
learner's stream; a malformed one is rejected with a reason, never silently dropped.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

MAX_TOKENS = 65_536


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


def validate_record(raw: Any, *, job_id: int | None = None, max_version: int | None = None) -> Trajectory:
    """Parse and check one record; raise :class:`RecordError` with a one-line reason.

    ``max_version`` rejects records claiming a version the learner has not published yet (a worker
    cannot have generated under a snapshot that does not exist).
    """
    try:
        record = Trajectory.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "record"
        raise RecordError(f"{where}: {first['msg']}") from None
    if job_id is not None and record.job_id != job_id:
        raise RecordError(f"job_id: record is for job {record.job_id}, not job {job_id}")
    if max_version is not None and record.version > max_version:
        raise RecordError(f"version: {record.version} was never published (latest is {max_version})")
    return record

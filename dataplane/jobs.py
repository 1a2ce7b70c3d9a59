"""The job specification: GRPO hyper-parameters and system knobs, validated the same way everywhere.

The site validates a job with it before saving (a bad field is a 400 naming the field) and the learner
parses the job it is given into it, so both read one definition of every field and its bounds. The
job's statuses live here too: the site stores them, the learner reads them to pause, resume or stop.
"""

from __future__ import annotations

import difflib
import os
from enum import StrEnum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .broadcast import BroadcastStrategy
from .chat import PromptFormat
from .evalspec import EvalConfig
from .lora import LoraSpec
from .losses import LOSS_TYPES, loss_types_help
from .requirements import Requirements
from .tasks import TaskSpecError, build_task


class JobStatus(StrEnum):
    """Where a job is in its life; the site's ``Job.Status`` is built from it."""

    DRAFT = "draft"  # created, not started
    RUNNING = "running"
    PAUSED = "paused"  # no generation (and no billing); the learner waits, and trains what is queued
    STALLED = "stalled"  # the learner went silent: workers released (no billing) until it comes back
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


TERMINAL: frozenset[JobStatus] = frozenset({JobStatus.COMPLETED, JobStatus.FAILED, JobStatus.CANCELLED})
"""The final statuses: nothing trains or generates for the job again."""


class JobSpecError(ValueError):
    """A job field out of bounds; ``field`` names it, ``str(err)`` says why.

    A spec can be wrong in several places at once (a misspelt key, a value out of bounds); ``errors`` holds
    every ``(field, message)``, first one first, so a person fixes them in one pass, not one per attempt.
    """

    def __init__(self, field: str, message: str, *, errors: list[tuple[str, str]] | None = None) -> None:
        self.errors = errors or [(field, message)]
        more = f" (and {len(self.errors) - 1} more)" if len(self.errors) > 1 else ""
        super().__init__(f"{field}: {message}{more}")
        self.field = field
        self.message = message

    def by_field(self) -> dict[str, list[str]]:
        """Every reason, by field: the ``errors`` of the API's error shape."""
        out: dict[str, list[str]] = {}
        for field, message in self.errors:
            out.setdefault(field, []).append(message)
        return out

    def one_line(self) -> str:
        """Every error on one line, for a command-line tool."""
        return "; ".join(f"{field}: {message}" for field, message in self.errors)


class LossConfig(BaseModel):
    """GRPO loss settings; the learner implements them (learner/grpo.py, its variants ``type`` in learner/losses/).

    The defaults are the plain token-level PPO-clip surrogate against the behaviour log-probs the
    workers returned, clip range ``clip_eps``, token-mean aggregation, no KL term. Four defaults depend
    on the job or on ``type``; :class:`JobSpec` fills them in (:meth:`resolved`), so a job's ``loss``
    always holds the values the learner trains with.
    """

    model_config = ConfigDict(extra="forbid")

    type: str = Field(
        default="grpo", description=loss_types_help(),
        json_schema_extra=lambda schema: schema.update(enum=list(LOSS_TYPES)))  # the declared variants
    advantage: Literal["std", "mean"] = Field(
        default="std", description="std: (r - group mean) / (group std + eps); mean: r - group mean (Dr.GRPO).")
    advantage_eps: float = Field(default=1e-6, ge=0.0, le=1.0, description="eps added to the group std.")
    advantage_std: Literal["unbiased", "population"] = Field(
        default="unbiased", description="The group std of the std advantage: unbiased (divides by n - 1, as the "
        "GRPO paper's code, verl and TRL) or population (divides by n). A group of one sample gets advantage 0.")
    clip_eps_low: float | None = Field(
        default=None, gt=0.0, lt=1.0, description="Lower clip range: ratio >= 1 - eps_low; default the job's "
        "clip_eps.")
    clip_eps_high: float | None = Field(
        default=None, gt=0.0, le=10.0, description="Upper clip range: ratio <= 1 + eps_high (DAPO clip-higher, "
        "e.g. 0.28); default eps_low.")
    kl_beta: float = Field(default=0.0, ge=0.0, le=10.0, description="Weight of the k3 KL to the frozen base "
                           "model; 0 keeps no reference model.")
    aggregation: Literal["token-mean", "seq-mean-token-mean", "seq-mean-token-sum",
                         "seq-mean-token-sum-norm"] | None = Field(
        default=None, description="token-mean: over all tokens of the batch (DAPO); seq-mean-token-mean: per "
        "sequence, then over sequences (GRPO, GSPO); seq-mean-token-sum: token sums, then the mean over "
        "sequences (verl's meaning); seq-mean-token-sum-norm: token sums over a constant normalizer, "
        "B * norm_length (Dr.GRPO). Default: token-mean for grpo, seq-mean-token-mean for gspo.")
    norm_length: int | None = Field(
        default=None, ge=1, le=1_000_000, description="Constant length normalizer of seq-mean-token-sum-norm; "
        "default the job's max_new_tokens.")
    dual_clip: float | None = Field(
        default=None, gt=1.0, le=100.0, description="Dual-clip bound c (verl's clip_ratio_c, e.g. 3): where the "
        "advantage is negative the surrogate is at least c * A. null: off.")
    off_policy: Literal["behaviour", "tis", "mis", "decoupled", "none"] = Field(
        default="behaviour", description="behaviour: PPO ratio against the worker's log-probs; tis/mis: "
        "decoupled ratio with the behaviour weight truncated per token (TIS) or masked per sequence (MIS); "
        "decoupled: AReaL's objective, the ratio against the learner's policy before the step and the "
        "behaviour weight untruncated; none: records treated as on-policy (ablation).")
    is_cap: float = Field(default=2.0, ge=1.0, le=1000.0, description="C: cap of the TIS weight, "
                          "threshold of the MIS mask (decoupled does not read it).")
    max_grad_norm: float | None = Field(
        default=1.0, gt=0.0, le=1e6, description="Rescale an update whose global gradient L2 norm exceeds this "
        "(the usual 1.0 of TRL and verl; it stops one noisy batch from wrecking a small policy); null: no "
        "clipping.")

    @field_validator("type")
    @classmethod
    def _declared_type(cls, value: str) -> str:
        if value not in LOSS_TYPES:
            raise ValueError(f"unknown loss type {value!r}; available: {', '.join(LOSS_TYPES)}")
        return value

    @property
    def is_resolved(self) -> bool:
        """Every default filled in (see :meth:`resolved`): what the loss code needs."""
        return None not in (self.clip_eps_low, self.clip_eps_high, self.aggregation, self.norm_length)

    def resolved(self, *, clip_eps: float, max_new_tokens: int) -> LossConfig:
        """A copy with every default filled in: ``clip_eps_low`` the job's ``clip_eps``, ``clip_eps_high``
        ``clip_eps_low``, ``aggregation`` by ``type`` (its declared default: token-mean for grpo,
        seq-mean-token-mean for gspo),
        ``norm_length`` the job's ``max_new_tokens``. Values already set are kept."""
        low = self.clip_eps_low if self.clip_eps_low is not None else clip_eps
        return self.model_copy(update={
            "clip_eps_low": low,
            "clip_eps_high": self.clip_eps_high if self.clip_eps_high is not None else low,
            "aggregation": self.aggregation or LOSS_TYPES[self.type].default_aggregation,
            "norm_length": self.norm_length or max_new_tokens,
        })


class JobSpec(BaseModel):
    """A GRPO job's settings: a job file, the body that creates a job, what the learner trains with.

    What a person wrote goes through :func:`parse_job_spec`, which refuses unknown keys; the model itself
    ignores them because the learner validates the site's whole job (id, status, ...) with it."""

    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=100, description="Human-readable job name.")
    model_dir: str = Field(min_length=1, max_length=500, description="Absolute path of the base checkpoint directory "
                           "(Hugging Face layout) on the learner's machine; workers receive it from the learner.")
    task: dict[str, Any] = Field(description='Task adapter spec, e.g. {"name": "arithmetic"}.')
    staleness: int = Field(default=3, ge=2, le=1000, description="S: largest admissible version lag (>= 2).")
    kappa: int | None = Field(default=None, ge=1, description="Snapshot period in steps; default S-1, must be < S.")
    batch_trajectories: int = Field(default=128, ge=1, le=1_000_000, description="R: trajectories per step.")
    group_size: int = Field(default=8, ge=2, le=1024, description="n: samples per prompt (GRPO group).")
    gamma: float = Field(default=1.1, ge=1.0, le=10.0, description="Safety factor on needed throughput.")
    learner_uplink_bps: int = Field(default=125_000_000, ge=1, le=10**12, description="B0: learner uplink in bytes/s.")
    learning_rate: float = Field(default=1e-3, gt=0, le=1.0, description="AdamW learning rate.")
    clip_eps: float = Field(default=0.2, gt=0, le=10.0, description="PPO clip range epsilon.")
    max_steps: int = Field(default=300, ge=1, le=10_000_000, description="Learner steps before completion.")
    budget_usd: float | None = Field(
        default=None, gt=0, le=1e9, allow_inf_nan=False, description="Most the job may spend, USD: the site pauses it "
        "before a step would take its spend past this (docs/ledger.md \"Budgets\"); the owner may raise it later. "
        "None: no cap.")
    max_new_tokens: int = Field(default=8, ge=1, le=32_768, description="Longest completion, in tokens.")
    temperature: float = Field(default=1.0, ge=0.0, le=10.0, description="Sampling temperature (0 = greedy).")
    top_p: float = Field(default=1.0, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    seed: int = Field(default=0, ge=-(2**31), le=2**31 - 1, description="Seed for prompts and initialisation.")
    target_reward: float | None = Field(default=None, ge=-1e15, le=1e15, allow_inf_nan=False,
                                        description="Complete early once the 10-step mean reward "
                                        "reaches this value.")
    loss: LossConfig = Field(default_factory=LossConfig, description="GRPO loss variant and its settings.")
    broadcast_strategy: BroadcastStrategy = Field(
        default="chain", description="Snapshot broadcast: chain (learner -> seeds -> chains, section 4.2), or "
        "every worker pulls from the learner (star-limited: B0 shared; star-unlimited: no cap).")
    snapshot_dtype: Literal["bf16", "fp32"] = Field(
        default="bf16", description="The dtype snapshots carry the weights in: bf16 (what engines serve; half the "
        "bytes of fp32) or fp32 (the learner's own precision).")
    prompt_format: PromptFormat = Field(
        default_factory=PromptFormat, description="How a prompt becomes the model's input, the same for the engines, "
        "the learner and the exported model (docs/prompts.md): {\"chat\": false} the text with the tokenizer's own "
        "special tokens (a base model); {\"chat\": true, \"system_prompt\": \"...\"} the tokenizer's chat template "
        "with add_generation_prompt (an instruct model).")
    requirements: Requirements = Field(
        default_factory=Requirements, description="What a worker must have to be activated for this job: "
        "min_gpu_memory_gb (default: estimated from the model), engine (any, hf, vllm), max_price_per_hour, "
        "min_reliability (docs/scheduling.md \"Reliability\").")
    eval: EvalConfig = Field(
        default_factory=EvalConfig, description="Scoring the policy on held-out problems while it trains "
        "(docs/learner.md \"Evaluation\"): before, after, every N updates; pass@1 greedy and mean@k over a split "
        "of the task. Off by default.")
    snapshot_full_every: int = Field(
        default=0, ge=0, le=10_000, description="K: every K-th published version travels as a full snapshot (1: "
        "every version, for agents older than deltas); 0, the default: none after the first, every version a "
        "lossless delta against the version before, and a worker lacking its base fetches the version's full "
        "payload from the learner's store (docs/broadcast.md \"Deltas on the wire, fulls from the cache\").")
    lora: LoraSpec = Field(
        default_factory=LoraSpec, description="Train a LoRA adapter on the frozen base instead of the whole model: "
        "{\"rank\": 8} (alpha, dropout, target_modules optional); every snapshot after the base is then the "
        "adapter alone, a few MB (docs/lora.md). rank 0, the default: the whole model.")

    @field_validator("model_dir")
    @classmethod
    def _model_dir_is_a_path(cls, value: str) -> str:
        if not os.path.isabs(value):
            raise ValueError(f"{value!r} is not an absolute path: model_dir is a checkpoint directory on the "
                             "learner's machine (a hub id is not downloaded; fetch it there first)")
        return value

    @field_validator("task")
    @classmethod
    def _task_exists(cls, value: dict[str, Any]) -> dict[str, Any]:
        try:
            return build_task(value).spec()
        except TaskSpecError as err:
            raise ValueError(str(err).removeprefix("task: ")) from None

    @model_validator(mode="after")
    def _consistent(self) -> JobSpec:
        """Checks across fields, every failing one reported: one ``field: reason`` per line."""
        if self.kappa is None:
            self.kappa = self.staleness - 1
        problems = []
        if self.kappa >= self.staleness:
            problems.append(f"kappa: must be < staleness S={self.staleness} (default S-1)")
        if self.batch_trajectories % self.group_size:
            problems.append(
                f"batch_trajectories: R={self.batch_trajectories} must be a multiple of group_size n={self.group_size}"
            )
        if self.loss.clip_eps_low is None and self.clip_eps >= 1.0:
            problems.append(f"clip_eps: {self.clip_eps} is the default of loss.clip_eps_low, which must be < 1; "
                            "set loss.clip_eps_low, or a clip_eps below 1")
        if self.eval.enabled:
            try:
                self.eval.build_task(self.task)
            except TaskSpecError as err:
                problems.append(f"eval.{str(err).removeprefix('task: ')}")
        if problems:
            raise ValueError("\n".join(problems))
        self.loss = self.loss.resolved(clip_eps=self.clip_eps, max_new_tokens=self.max_new_tokens)
        return self

    @property
    def groups_per_step(self) -> int:
        return self.batch_trajectories // self.group_size


def model_dir_problem(model_dir: str) -> str | None:
    """Why ``model_dir`` is not a checkpoint directory on this machine (None: it is one). The learner checks
    at start; the site checks when a job is created or started, where it sees the learner's paths (same
    machine, or a shared mount; ``ECHO2_CHECK_MODEL_DIR``)."""
    path = Path(model_dir)
    if not path.is_absolute():
        return f"{model_dir!r} is not an absolute path"
    if not path.is_dir():
        return f"no directory {model_dir} on this machine"
    if not (path / "config.json").is_file():
        return f"{model_dir} has no config.json (a checkpoint directory in Hugging Face layout is expected)"
    return None


NESTED: dict[str, type[BaseModel]] = {"requirements": Requirements, "loss": LossConfig, "prompt_format": PromptFormat,
                                      "eval": EvalConfig, "lora": LoraSpec}
"""The job settings that are tables of settings, each refusing unknown keys."""


def unknown_keys(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """``(field, message)`` for every key of ``raw`` (and of its tables, :data:`NESTED`) that is no job setting,
    each with the closest known name: a misspelt ``stalenes`` would otherwise be dropped and its default used in
    silence."""
    known = {name: name for name in JobSpec.model_fields}
    for table, model in NESTED.items():
        known |= {name: f"{table}.{name}" for name in model.model_fields if name not in known}
    found = [(str(key), _did_you_mean(str(key), known)) for key in raw if key not in JobSpec.model_fields]
    for table, model in NESTED.items():
        value = raw.get(table)
        if isinstance(value, dict):
            inside = {name: f"{table}.{name}" for name in model.model_fields}
            found += [(f"{table}.{key}", _did_you_mean(str(key), inside)) for key in value if key not in inside]
    return found


def _did_you_mean(key: str, known: dict[str, str]) -> str:
    """'unknown key', with the dotted name of the closest known key (``known``: bare name -> dotted name)."""
    close = difflib.get_close_matches(key, list(known), n=1, cutoff=0.6)
    return f"unknown key (did you mean {known[close[0]]}?)" if close else "unknown key"


def _validation_errors(err: ValidationError) -> list[tuple[str, str]]:
    """pydantic's errors as ``(field, message)``; a cross-field check names its fields itself, one per line (a
    table's check its keys: ``prompt_format.system_prompt``)."""
    out = []
    for error in err.errors():
        if error["type"] == "extra_forbidden":
            continue  # reported by unknown_keys, with a suggestion
        field = ".".join(str(p) for p in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        for line in message.splitlines():
            name, reason = (field, line)
            head, _, rest = line.partition(":")
            if rest and (not field or field in NESTED and head.isidentifier()):  # a check naming its field
                name, reason = (f"{field}.{head}" if field else head), rest
            out.append((name.strip() or "job", reason.strip()))
    return out


def parse_job_spec(raw: dict[str, Any]) -> JobSpec:
    """Validate ``raw`` as a person wrote it: unknown keys refused (with the nearest known name), every bad
    field reported at once; raise :class:`JobSpecError` naming the first and holding them all."""
    if not isinstance(raw, dict):
        raise JobSpecError("job", "must be a mapping of settings")
    errors = unknown_keys(raw)
    try:
        spec = JobSpec.model_validate(raw)
    except ValidationError as err:
        errors += _validation_errors(err)
    if errors:
        raise JobSpecError(*errors[0], errors=errors)
    return spec

"""The learner's options: one typed model, read from keyword arguments or the environment.

``echo2-learner run`` builds its flags from these fields (learner/cli.py): the flag is ``--`` and the
field name in kebab case unless the field names another (``flag=``), ``--x/--no-x`` for a bool; the
help text, default, bounds and environment variable come from here too. A field reads the one
environment variable it declares (``env=``) and no other, so an unrelated ``DEBUG`` or ``DEVICE`` in
the environment changes nothing.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, model_validator
from pydantic.fields import FieldInfo
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from dataplane.tokens import read_token_file


def option(default: Any = ..., *, help: str, flag: str | None = None, env: str | None = None,  # noqa: A002
           **bounds: Any) -> Any:
    """A field of :class:`LearnerSettings`: ``help`` is its one-line doc, ``bounds`` pydantic's (``ge=1``)."""
    extra = {key: value for key, value in (("flag", flag), ("env", env)) if value}
    return Field(default, description=help, json_schema_extra=extra or None, **bounds)


class LearnerSettings(BaseSettings):
    """What ``echo2-learner run`` needs: the site and job, Redis, snapshots, checkpoints, devices."""

    model_config = SettingsConfigDict(frozen=True, extra="forbid")

    server: str = option(help="Site URL, e.g. http://127.0.0.1:8000.", env="ECHO2_SERVER")
    job: int = option(help="Job id to train.", env="ECHO2_JOB")
    token: str | None = option(None, help="The job owner's API token. Prefer --token-file or ECHO2_TOKEN: a --token "
                               "shows in `ps`.", env="ECHO2_TOKEN", repr=False)
    token_file: Path | None = option(None, help="A file holding the job owner's API token (first line; keep it mode "
                                     "600). Wins over --token.", env="ECHO2_TOKEN_FILE")
    redis_url: str | None = option(None, help="Override: the Redis URL of the job's streams, for a single-machine "
                                   "setup. Default: the site hands this learner its own door (a Redis user whose keys "
                                   "are the job's alone, docs/trust.md \"The learner's door\").", flag="--redis",
                                   env="ECHO2_LEARNER_REDIS_URL")
    redis_ca: Path | None = option(None, help="CA certificate (PEM) to check a rediss:// streams server against "
                                   "(default: the system's CAs).", env="ECHO2_REDIS_CA")
    redis_retry_s: float = option(300.0, ge=0, help="Ride out a Redis outage (a restart) this long per operation, "
                                  "retrying with backoff, before the job fails.", flag="--redis-retry")
    snapshot_dir: Path = option(Path("var/snapshots"), help="Where snapshots are written.")
    dataset: Path | None = option(None, help="The data set a `dataset` job names by digest (a file, or a directory "
                                  "of its files), read here and served to the workers; without it an uploaded data "
                                  "set comes from the site (docs/datasets.md).")
    snapshot_retain_s: float = option(600.0, ge=0, help="Keep every snapshot published in the last this many "
                                      "seconds, besides the newest S+2 and the base (version 0, kept for the whole "
                                      "job), so an agent still downloading one finds it.", flag="--snapshot-retain")
    audit_fraction: float = option(0.05, ge=0, le=1, help="Share of the groups read whose log-probs and rewards "
                                   "are recomputed and checked (docs/trust.md \"Audits\"); 0: no audits.",
                                   flag="--audit-fraction")
    audit_logprob_tolerance: float = option(0.1, gt=0, help="Largest mean |claimed - recomputed| log-prob per "
                                            "token an audit passes (CPU fp32 engines agree to ~1e-6; bf16 engines "
                                            "within a few 1e-2, up to 0.08 under a confident policy).",
                                            flag="--audit-logprob-tolerance")
    audit_logprob_nats: float = option(0.7, gt=0, help="Per token, a claimed log-prob may be off by at most "
                                       "--audit-logprob-floor + (1 - p) (this + --audit-logprob-tail-nats (1 - p)), "
                                       "p the recomputed probability: the spread of logit errors an engine may add "
                                       "(docs/trust.md \"Audits\").", flag="--audit-logprob-nats")
    audit_logprob_tail_nats: float = option(1.0, ge=0, help="What unlikely tokens are allowed beyond "
                                            "--audit-logprob-nats (the likely tokens' large logits and their "
                                            "rounding weigh on them).", flag="--audit-logprob-tail-nats")
    audit_logprob_floor: float = option(1e-3, ge=0, help="The per-token allowance of a token the policy is sure of.",
                                        flag="--audit-logprob-floor")
    audit_logprob_share: float = option(0.1, ge=0, le=1, help="A group fails when more than this share of its "
                                        "learning tokens is past the per-token allowance.",
                                        flag="--audit-logprob-share")
    audit_probation: int = option(16, ge=0, le=1_000_000, help="A worker's first groups in the job, and its "
                                  "groups after a failed audit, all audited; then its share falls as probation/k to "
                                  "--audit-fraction (docs/trust.md \"Audits\").", flag="--audit-probation")
    snapshot_host: str = option("127.0.0.1", help="Address the snapshot server binds.")
    snapshot_port: int = option(0, help="Port of the snapshot server (0: any free port).")
    advertise_host: str | None = option(None, help="Host agents use to reach the snapshot server.")
    relay: bool = option(True, help="Serve snapshots to chain seeds over a relay port (strategy chain; "
                         "docs/broadcast.md). HTTP stays the fallback.")
    relay_port: int = option(0, help="Port of the relay hub (0: any free port).")
    relay_mode: Literal["process", "thread"] = option("process", help="Where the relay hub runs: process (a child "
                                                      "process, restarted on the same port if it dies; its sends "
                                                      "never wait for the GIL training holds) or thread (a thread "
                                                      "of the learner's process, sharing the GIL with training).",
                                                      env="ECHO2_LEARNER_RELAY_MODE")
    data_timeout_s: float = option(300.0, help="Fail the job after this many seconds without data (not while "
                                   "it is paused).", flag="--data-timeout")
    status_poll_s: float = option(10.0, gt=0, help="While waiting for data, ask the site this often (seconds) "
                                  "whether the job was paused, resumed or cancelled.", flag="--status-poll")
    device: str = option("cpu", help="torch device: cpu, cuda, cuda:1 ... (under torchrun: cpu or cuda; each rank "
                         "takes cuda:LOCAL_RANK).")
    checkpoint_dir: Path | None = option(None, help="Where checkpoints go (default: <snapshot-dir>/job<ID>-checkpoint);"
                                         " a restart resumes from here.")
    checkpoint_every: int | None = option(None, ge=1, help="Checkpoint period in steps (default kappa; publication "
                                          "steps always checkpoint).")
    micro_batch: int | None = option(None, ge=1, help="Rows per forward/backward on each rank (gradient "
                                     "accumulation).")
    bf16: bool = option(False, help="bf16 compute: autocast of the forward passes (CUDA; with --parallel ddp), or "
                        "FSDP mixed precision (bf16 parameters gathered for compute, fp32 master weights, optimizer "
                        "and gradient reduction; CPU too).")
    parallel: Literal["ddp", "fsdp"] = option("ddp", help="Under torchrun: ddp (every rank holds the whole model "
                                              "and optimizer; small models) or fsdp (parameters, gradients and "
                                              "optimizer sharded across the ranks; checkpoints sharded too).")
    activation_checkpointing: bool = option(False, help="Recompute each transformer block's activations in the "
                                            "backward instead of keeping them (less memory, about a third more "
                                            "compute).")
    site_timeout_s: float = option(15.0, ge=1.0, help="Seconds per site request; 5 retries, then the learner gives "
                                   "up.", flag="--site-timeout")
    heartbeat_s: float = option(15.0, gt=0, help="Tell the site this often (seconds) that the learner is alive; the "
                                "site stalls a job whose learner is silent for ECHO2_LEARNER_TIMEOUT_S (90 s).",
                                flag="--heartbeat")
    site_outage_s: float = option(600.0, ge=0, help="At the end of the job, keep trying this long to deliver "
                                  "reports queued while the site was down (training never waits for the site).",
                                  flag="--site-outage")
    logdir: Path = option(Path("var/runs"), help="Experiment logs: TensorBoard event files go to <logdir>/job<ID> "
                          "(view them with: tensorboard --logdir var/runs).", env="ECHO2_LOGDIR")
    tensorboard: bool = option(True, help="Write TensorBoard event files under --logdir.")
    wandb_project: str | None = option(None, help="Log every step to this W&B project too (needs echo2[wandb]; "
                                       "W&B's own variables apply: WANDB_API_KEY, WANDB_ENTITY, WANDB_MODE).",
                                       env="WANDB_PROJECT")
    wandb_name: str | None = option(None, help="The W&B run's name (default job-<ID>).", env="WANDB_NAME")
    wandb_tags: str | None = option(None, help="The W&B run's tags, comma-separated.", env="WANDB_TAGS")
    samples_every: int = option(10, ge=0, help="Every this many steps keep a few of the trained records (prompt, "
                                "completion, reward, version, worker) for the site and the experiment logs; 0: never.")
    samples_per_step: int = option(4, ge=1, le=16, help="How many records such a step keeps (chosen with the job's "
                                   "seed).", flag="--samples")
    debug: bool = option(False, help="Show full tracebacks.")

    @model_validator(mode="before")
    @classmethod
    def _token_from_file(cls, data: Any) -> Any:
        """The token is read from ``token_file`` when one is named (it wins over ``token``)."""
        if isinstance(data, dict) and data.get("token_file"):
            data = {**data, "token": read_token_file(Path(data["token_file"]))}
        return data

    @model_validator(mode="after")
    def _token_given(self) -> LearnerSettings:
        if not self.token:
            raise ValueError("no API token: give --token-file PATH (or ECHO2_TOKEN_FILE), or ECHO2_TOKEN")
        return self

    @classmethod
    def flag(cls, name: str) -> str:
        """The command-line flag of field ``name`` (``--redis`` for ``redis_url``)."""
        return _extra(cls.model_fields[name]).get("flag") or "--" + name.replace("_", "-")

    @classmethod
    def env(cls, name: str) -> str | None:
        """The environment variable field ``name`` reads, if any."""
        return _extra(cls.model_fields[name]).get("env")

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   **_: PydanticBaseSettingsSource) -> tuple[PydanticBaseSettingsSource, ...]:
        return init_settings, _DeclaredEnvironment(settings_cls)

    def saved(self) -> dict[str, Any]:
        """The options as JSON values for the run's config.json: no token, no Redis password."""
        out = self.model_dump(mode="json", exclude={"token"})
        out["redis_url"] = _masked(self.redis_url) if self.redis_url else None
        return out



def _extra(field: FieldInfo) -> dict[str, Any]:
    extra = field.json_schema_extra
    return extra if isinstance(extra, dict) else {}


class _DeclaredEnvironment(PydanticBaseSettingsSource):
    """Each field from the environment variable it declares (an empty value counts as unset, as in click)."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        name = _extra(field).get("env")
        return (os.environ.get(name) or None) if name else None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values = {name: self.get_field_value(field, name)[0] for name, field in self.settings_cls.model_fields.items()}
        return {name: value for name, value in values.items() if value is not None}


def redis_location(url: str) -> str:
    """``url`` without its user and password: what a log line may show."""
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    return urlunsplit(parts._replace(netloc=f"{parts.hostname}:{parts.port or 6379}"))


def _masked(url: str) -> str:
    from urllib.parse import urlsplit, urlunsplit

    parts = urlsplit(url)
    if not parts.password:
        return url
    return urlunsplit(parts._replace(netloc=f"***@{parts.hostname}:{parts.port or 6379}"))

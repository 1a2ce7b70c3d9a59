"""Marketplace data: providers and their workers, jobs, activations (for cost), snapshots, metrics."""

from __future__ import annotations

import copy
from decimal import Decimal
from typing import get_args

from django.conf import settings
from django.core.validators import MinValueValidator
from django.db import models
from django.utils import timezone

from dataplane.credentials import new_secret
from dataplane.hardware import Hardware
from dataplane.jobs import TERMINAL as TERMINAL_STATUSES
from dataplane.jobs import JobSpec, JobStatus
from dataplane.messages import WorkerState

from .ledger import AMOUNT_PLACES, LedgerEntry, PriceChange  # noqa: F401 (Django finds the models here)
from .samples import JobSample  # noqa: F401 (Django finds the model here)


class Provider(models.Model):
    """A user who offers GPU machines (workers) to the marketplace."""

    user = models.OneToOneField(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="provider")
    display_name = models.CharField(max_length=100, blank=True)
    suspended_at = models.DateTimeField(null=True, blank=True, help_text="When one of its workers was suspended for "
                                        "failed audits: every worker of the account is suspended with it, a new one "
                                        "starts suspended, until staff lift it (admin).")
    suspended_reason = models.CharField(max_length=600, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.display_name or self.user.get_username()


class Worker(models.Model):
    """One machine running ``echo2-agent``; price ``c_i`` and measured throughput ``mu_i``."""

    class Status(models.TextChoices):
        OFFLINE = "offline", "offline"
        IDLE = "idle", "idle (connected, not in a job)"
        ACTIVE = "active", "active (generating for a job)"

    provider = models.ForeignKey(Provider, on_delete=models.CASCADE, related_name="workers")
    name = models.CharField(max_length=100)
    gpu = models.CharField(max_length=100, blank=True, help_text="GPU model, e.g. 'RTX 5090'.")
    price_per_hour = models.DecimalField(
        max_digits=10, decimal_places=4, validators=[MinValueValidator(Decimal("0.0001"))], help_text="c_i, USD/h."
    )
    bandwidth_bps = models.BigIntegerField(validators=[MinValueValidator(1)], help_text="Link B_w, bytes/s.")
    relay_address = models.CharField(max_length=200, blank=True, help_text="host:port peers reach, if any.")
    relay_successes = models.PositiveIntegerField(default=0, help_text="Snapshots received over a relay link.")
    relay_failures = models.PositiveIntegerField(default=0, help_text="Relay links this worker broke (as parent).")
    relay_last_failure_at = models.DateTimeField(null=True, blank=True)
    measured_bandwidth_bps = models.FloatField(
        null=True, blank=True, help_text="Bw_hat, bytes/s: moving average of the snapshot rate its chain children "
                                         "received through it; None until it has relayed one.")
    status = models.CharField(max_length=16, choices=Status.choices, default=Status.OFFLINE)
    last_heartbeat = models.DateTimeField(null=True, blank=True)
    throughput = models.FloatField(null=True, blank=True, help_text="mu_i, trajectories/s (measured).")
    installed_version = models.IntegerField(null=True, blank=True)
    key_hash = models.CharField(max_length=64, unique=True, help_text="sha256 of the agent key.")
    audits_passed = models.PositiveIntegerField(default=0, help_text="Audited groups whose log-probs and rewards "
                                                "the learner recomputed and found right (all jobs).")
    audits_failed = models.PositiveIntegerField(default=0, help_text="Audited groups found wrong (all jobs).")
    suspended_at = models.DateTimeField(null=True, blank=True, help_text="When repeated audit failures suspended "
                                        "it: never activated again until staff lift it (admin).")
    suspended_reason = models.CharField(max_length=600, blank=True)
    paused_at = models.DateTimeField(null=True, blank=True, help_text="When its provider paused it: never "
                                     "activated until resumed (docs/ledger.md \"Provider and owner controls\").")
    removed_at = models.DateTimeField(null=True, blank=True, help_text="When its provider removed it: its key "
                                      "revoked, hidden from lists; its history and ledger kept.")
    hardware = models.JSONField(default=dict, blank=True, help_text="What the machine has, as its agent measured "
                                "it at registration and in its last hello (dataplane.hardware.Hardware); claims "
                                "used only for matching jobs' requirements. Empty: never reported.")
    hardware_at = models.DateTimeField(null=True, blank=True, help_text="When the agent last reported its hardware.")
    allow_user_code = models.BooleanField(null=True, blank=True, help_text="Whether its provider runs job owners' "
                                          "code on it (echo2-agent run --allow-user-code), as its last hello said; "
                                          "null: its agent never said (older), matched as before and refuses such a "
                                          "job itself if it does not.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["provider", "name"], name="unique_worker_name")]
        ordering = ["id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.provider})"

    @property
    def audit_pass_rate(self) -> float | None:
        """Share of its audited groups that passed; None before its first audit."""
        audited = self.audits_passed + self.audits_failed
        return self.audits_passed / audited if audited else None

    @property
    def facts(self) -> Hardware | None:
        """Its hardware as the agent reported it (checked when stored), None if never reported."""
        return Hardware.model_validate(self.hardware) if self.hardware else None

    @property
    def relay_bandwidth_bps(self) -> float:
        """The bandwidth the chain planner uses: measured once it has relayed, else the registered figure."""
        return self.measured_bandwidth_bps or float(self.bandwidth_bps)

    @property
    def unit_cost(self) -> float | None:
        """rho_i = c_i / mu_i (USD/h per trajectory/s): the price of one unit of throughput; None until measured."""
        if not self.throughput:
            return None
        return float(self.price_per_hour) / self.throughput


class WorkerSession(models.Model):
    """One connection of a worker's agent, from its hello until the socket closed or it went silent.

    Uptime is the share of time covered by sessions; ``ended_at`` is None while the agent is connected.
    """

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="sessions")
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker"], condition=models.Q(ended_at=None), name="one_open_session")
        ]


class WorkerCalibration(models.Model):
    """Throughput a worker measured for a model and task (``echo2-agent bench --report``).

    The scheduler uses it for a job's model before the worker has served that job and reported live
    throughput in its heartbeats.
    """

    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="calibrations")
    model_dir = models.CharField(max_length=500)
    task_name = models.CharField(max_length=100)
    throughput = models.FloatField(validators=[MinValueValidator(1e-9)], help_text="mu_i, trajectories/s.")
    tokens_per_s = models.FloatField(null=True, blank=True)
    measured_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["worker", "model_dir", "task_name"],
                                               name="unique_calibration")]


class Job(models.Model):
    """A GRPO post-training job: its settings and its life (paper section 3.2 notation).

    The settings are ``dataplane.jobs.JobSpec``'s, stored whole in ``spec`` (validated, every default filled in);
    the few the site filters by (``SPEC_COLUMNS``) are columns as well, copied from it when the job is created
    (:meth:`from_spec`). They are read one way, typed: ``job.settings.kappa``, ``job.settings.loss.type``
    (:attr:`settings`), so a new JobSpec field needs no column and no migration.
    """

    # The statuses are dataplane's JobStatus (the learner reads them too); labels as before ("Draft", ...).
    Status = models.TextChoices("Status", [(status.name, status.value) for status in JobStatus])
    TERMINAL = frozenset(map(Status, TERMINAL_STATUSES))
    SPEC_COLUMNS = ("name", "model_dir", "task")  # shown in lists, and how an earlier job of a model is found

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="jobs")
    name = models.CharField(max_length=100)
    model_dir = models.CharField(max_length=500, help_text="Checkpoint directory in Hugging Face layout.")
    task = models.JSONField(help_text='Task adapter spec, e.g. {"name": "arithmetic"}.')
    spec = models.JSONField(default=dict, help_text="The job's settings (dataplane.jobs.JobSpec) as validated when it "
                            "was created, every default filled in: what its job file and its learner read.")

    class Reason(models.TextChoices):
        """Why a job is in its status, for the site to act on (``status_reason`` says it in words, for people)."""

        NONE = "", "none given"
        OVER_BUDGET = "over_budget", "paused: its next step would pass its budget (raising it runs the job again)"
        BY_PERSON = "by_person", "paused or cancelled by a person"
        LEARNER_SILENT = "learner_silent", "stalled: its learner went silent"
        LEARNER = "learner", "paused, completed or failed as its learner reported"

    status = models.CharField(max_length=16, choices=Status.choices, default=Status.DRAFT)
    status_reason = models.CharField(max_length=500, blank=True)
    reason_code = models.CharField(max_length=16, choices=Reason.choices, blank=True, default=Reason.NONE,
                                   help_text="Why the job is in its status, as a code (status_reason in words).")
    created_at = models.DateTimeField(auto_now_add=True)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)
    archived_at = models.DateTimeField(null=True, blank=True, help_text="When its owner archived it: hidden from "
                                       "lists unless asked for; its ledger kept.")

    learner_step = models.PositiveIntegerField(default=0, help_text="v_t: learner updates done.")
    published_version = models.PositiveIntegerField(default=0, help_text="Newest snapshot agents may use.")
    learner_t_train = models.FloatField(null=True, blank=True, help_text="Calibrated T_train, seconds.")
    learner_seen_at = models.DateTimeField(null=True, blank=True)
    learner_relay = models.CharField(max_length=200, blank=True, help_text="host:port of the learner's relay hub.")
    vocab_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="Rows of the model's token embedding, as the learner reported it: returned "
        "token ids must be below it (docs/trust.md). Unknown until the learner first announces itself.")
    # Signs the job's transfer credentials (docs/trust.md). Only the site and the job's learner (in the reply to
    # its announcement) know it: no serializer, page or agent message carries it.
    transfer_secret = models.CharField(max_length=64, default=new_secret, editable=False,
                                       help_text="Signs this job's weight-transfer credentials; never shown.")
    # The sha256 of the password of the learner's Redis user (docs/trust.md "The learner's door"): the site re-creates
    # the user from it when Redis lost it (a restart; ACL users are not in the AOF). Empty: no learner door open.
    learner_redis_password_sha256 = models.CharField(max_length=64, blank=True, editable=False, help_text=(
        "sha256 of the learner's Redis password (its user re-created from it); empty when no learner is let in."))
    base_digest = models.CharField(max_length=64, blank=True, help_text="sha256 of the base snapshot (version 0) "
                                   "payload: the job's base weights, config and tokenizer as the learner published "
                                   "them; empty until then.")
    # The scheduler's hysteresis clocks (controller.HysteresisController.state()), saved in the transaction that
    # applies the activations and releases they led to (services.job_replan_apply).
    hysteresis_below_since = models.FloatField(
        null=True, blank=True, help_text="Since when (Unix time, s) the pool's capacity has been below the target.")
    hysteresis_above_since = models.FloatField(
        null=True, blank=True, help_text="Since when (Unix time, s) the pool's capacity has been above the margin.")

    class Meta:
        ordering = ["-id"]

    def __str__(self) -> str:
        return f"#{self.pk} {self.name}"

    @property
    def is_terminal(self) -> bool:
        return self.status in self.TERMINAL

    @classmethod
    def from_spec(cls, spec: JobSpec, **fields) -> Job:
        """An unsaved job with the settings ``spec``: all in ``spec``, the queried ones in their columns too."""
        values = spec.model_dump(mode="json")
        return cls(spec=values, **{name: values[name] for name in cls.SPEC_COLUMNS}, **fields)

    @property
    def settings(self) -> JobSpec:
        """The job's settings as a JobSpec (typed: ``settings.loss`` is a ``LossConfig``), with the defaults of
        settings added since the job was created. Validated once per value of ``spec`` and the columns: a job
        whose ``spec`` is replaced or changed in place reads the new settings."""
        stored = (self.spec, *(getattr(self, name) for name in self.SPEC_COLUMNS))
        cached = self.__dict__.get("_settings")
        if cached is None or cached[0] != stored:
            resolved = JobSpec.model_validate(self.spec | dict(zip(self.SPEC_COLUMNS, stored[1:], strict=True)))
            cached = self.__dict__["_settings"] = (copy.deepcopy(stored), resolved)
        return cached[1]


class Activation(models.Model):
    """A worker serving a job from ``started_at`` to ``ended_at`` at its worker's price (changed from a date on:
    docs/ledger.md); each billed interval is a ledger entry, and only the
    time the site saw its worker generating (leases taken, groups accepted) is billed (``marketplace.core.billing``)."""

    State = models.TextChoices("State", [(state, state) for state in get_args(WorkerState)])

    class End(models.TextChoices):
        """Why an activation ended, for the site to act on (``end_reason`` says it in words, for people)."""

        OTHER = "", "other (the reason says)"
        SILENT = "silent", "returned nothing past the silence bound: counts against its reliability"
        REFUSED = "refused", "the worker refused the job (user code it does not run): never planned for it again"
        LOST = "lost", "its connection was lost: it rejoins the job if it says hello again soon"

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="activations")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="activations")
    price_per_hour = models.DecimalField(max_digits=10, decimal_places=4)
    started_at = models.DateTimeField(default=timezone.now)
    ended_at = models.DateTimeField(null=True, blank=True)
    end_reason = models.CharField(max_length=200, blank=True)
    end_code = models.CharField(max_length=8, choices=End.choices, blank=True, default=End.OTHER,
                                help_text="Why it ended, as a code (end_reason in words).")
    groups_accepted = models.PositiveIntegerField(default=0, help_text=(
        "Groups the site accepted from the worker in this activation, as the site counted them (never Redis): the "
        "cap on the audits its learner may report of it (marketplace/infra/delivered.py)."))
    billed_seconds = models.FloatField(default=0.0, help_text="Seconds billed: generating time the site saw "
                                       "(leases, accepted groups), up to its last report (or the end).")
    billed_usd = models.DecimalField(max_digits=20, decimal_places=AMOUNT_PLACES, default=Decimal(0), help_text=(
        "USD billed: the sum of its ledger entries, written with each (each interval at the rate then in force)."))
    state = models.CharField(max_length=16, choices=State.choices, default="loading",
                             help_text="What the site last saw the worker do for the job, never what its "
                             "heartbeats claim (a new activation loads).")
    state_reason = models.CharField(max_length=200, blank=True, help_text="Why the state is failed, if it is.")
    state_since = models.DateTimeField(default=timezone.now, help_text="When the agent entered ``state``.")
    reported_at = models.DateTimeField(default=timezone.now, help_text="The last state report: time is billed up "
                                       "to here.")

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["worker"], condition=models.Q(ended_at=None), name="one_open_activation")
        ]

    def cost_usd(self) -> float:
        """Its ledger's sum: each billed interval at the price then in force (``price_per_hour`` is the price now);
        an open activation's time since its last report is not in it yet."""
        return float(self.billed_usd)


class Snapshot(models.Model):
    """An immutable policy snapshot the learner published; ``t_bcast`` once enough workers installed."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="snapshots")
    version = models.PositiveIntegerField()
    url = models.URLField(max_length=500)
    manifest = models.JSONField()
    published_at = models.DateTimeField(default=timezone.now)
    installs = models.PositiveIntegerField(default=0)
    t_bcast = models.FloatField(null=True, blank=True, help_text="Publication until 1/gamma of workers installed.")
    installs_via_parent = models.PositiveIntegerField(default=0, help_text="Installs received over a relay chain.")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "version"], name="unique_snapshot_version")]
        ordering = ["version"]


class JobMetric(models.Model):
    """What the learner reported after one step."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="metrics")
    step = models.PositiveIntegerField()
    reward_mean = models.FloatField()
    reward_std = models.FloatField(default=0.0)
    loss = models.FloatField(default=0.0)
    max_staleness = models.PositiveIntegerField(default=0, help_text="Largest v_t - v trained on this step.")
    dropped_stale = models.PositiveIntegerField(default=0, help_text="Records dropped as too old, cumulative.")
    t_train = models.FloatField(default=0.0)
    wait_s = models.FloatField(default=0.0, help_text="Time the learner waited for data (bubble).")
    extra = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "step"], name="unique_metric_step")]
        ordering = ["step"]


class SnapshotInstall(models.Model):
    """A worker reported it installed a snapshot: counted once per worker and version, however often reported."""

    snapshot = models.ForeignKey(Snapshot, on_delete=models.CASCADE, related_name="install_reports")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="snapshot_installs")
    source = models.CharField(max_length=16, help_text="parent, fallback, http or cache (messages.SnapshotInstalled).")
    seconds = models.FloatField(help_text="Publication to install, as the agent saw it.")
    installed_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["snapshot", "worker"], name="one_install_per_worker")]


class WorkerAudit(models.Model):
    """The learner's audits of one worker's groups reported with one step (learner/audit.py): one row per
    (job, worker, step), so a report sent again (a restarted learner) counts once."""

    job = models.ForeignKey(Job, on_delete=models.CASCADE, related_name="audits")
    worker = models.ForeignKey(Worker, on_delete=models.CASCADE, related_name="audits")
    step = models.PositiveIntegerField()
    passed = models.PositiveIntegerField(default=0)
    failed = models.PositiveIntegerField(default=0)
    dropped_records = models.PositiveIntegerField(default=0, help_text="Its records dropped for the failures.")
    reason = models.CharField(max_length=500, blank=True, help_text="The last failure's.")
    evidence = models.JSONField(default=list, blank=True, help_text="What was checked: per failed (and a few "
                                "passed) groups, the entry and group, claimed against recomputed reward and "
                                "log-prob, the texts that differ (learner/audit.py Verdict); each failure with the "
                                "site's own check of it (site, site_reason: marketplace/core/audit_checks.py).")
    # The site's check of each reported failure (docs/trust.md "Audits the site checks"); they sum to ``failed``.
    failed_verified = models.PositiveIntegerField(default=0, help_text="Failures the site re-scored itself and "
                                                  "confirmed (wrong rewards): counted toward suspension.")
    failed_consistent = models.PositiveIntegerField(default=0, help_text="Log-prob or text failures whose evidence "
                                                    "matches the stored group, not recomputable at the site: counted "
                                                    "only when learners of several owners report such.")
    failed_unverified = models.PositiveIntegerField(default=0, help_text="Failures the site could not check (record "
                                                    "gone, no evidence, a user-code task): shown, never counted.")
    failed_refused = models.PositiveIntegerField(default=0, help_text="Failures whose evidence does not match the "
                                                 "stored group (a forged report): logged, never counted.")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["job", "worker", "step"], name="one_audit_row_per_step")]

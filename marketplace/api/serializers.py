"""API shapes. Validation of job fields is delegated to dataplane.jobs.JobSpec (one definition)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from decimal import Decimal

from django.conf import settings
from rest_framework import serializers
from rest_framework.fields import empty

from dataplane.hardware import Hardware, parse_hardware
from dataplane.jobs import JobSpec, JobSpecError, parse_job_spec
from dataplane.messages import MAX_THROUGHPUT

from ..core.addresses import AddressError, PeerPolicy, check_host_port, check_url
from ..models import Activation, Job, JobMetric, Snapshot, Worker, WorkerAudit, WorkerCalibration
from . import spec_fields
from .samples import sample_rows_field

# Bounds of numbers the API stores: every integer fits its column on every database (PostgreSQL's integer is 32
# bits), every float is finite (DRF) and small enough that sums and means of many stay finite (JSON has no inf).
MAX_INT = 2**31 - 1
MAX_SECONDS = 1e9
MIN_STEP_SECONDS = 1e-6  # a learner step (T_train) shorter than a microsecond is a lie or a bug: rates divide by it
MAX_FIGURE = 1e15
MAX_BANDWIDTH_BPS = 10**12  # 8 Tbit/s
MAX_VOCAB = 2**24  # token embedding rows: far beyond any real vocabulary (~256k)


def _peer_address(value: str | None, *, url: bool = False) -> str | None:
    """A relay address (host:port) or snapshot URL that other machines will dial (marketplace/core/addresses.py)."""
    if not value:
        return value
    policy = PeerPolicy(allow_loopback=settings.ECHO2["ALLOW_LOOPBACK_PEERS"],
                        allow_private=settings.ECHO2["ALLOW_PRIVATE_PEERS"])
    try:
        return check_url(value, policy) if url else check_host_port(value, policy)
    except AddressError as err:
        raise serializers.ValidationError(str(err)) from None


def _step_seconds(value: float | None, *, unknown: float | None) -> None:
    """A learner's T_train: ``unknown`` (not measured) or at least MIN_STEP_SECONDS. 1e-308 was finite, and every
    rate the site derives from it (throughput target, pool size) came out infinite: a 500 on the summary."""
    if value is not None and value != unknown and value < MIN_STEP_SECONDS:
        raise serializers.ValidationError(f"must be 0 (not measured) or at least {MIN_STEP_SECONDS:g} s")


def _bounded_extra(value, depth: int = 0) -> None:
    """A step report's ``extra``: JSON whose numbers are within MAX_FIGURE (1e308 was stored, and the job page's
    sums and charts of it overflowed), nested at most 6 deep, strings at most 4,000 characters."""
    if depth > 6:
        raise serializers.ValidationError("nested more than 6 deep")
    if isinstance(value, bool) or value is None:
        return
    if isinstance(value, int | float):
        if not math.isfinite(value) or abs(value) > MAX_FIGURE:
            raise serializers.ValidationError(f"numbers must be finite and within {MAX_FIGURE:g}, got {value!r}")
    elif isinstance(value, str):
        if len(value) > 4000:
            raise serializers.ValidationError("strings of at most 4000 characters")
    elif isinstance(value, dict | list):
        for item in (value.values() if isinstance(value, dict) else value):
            _bounded_extra(item, depth + 1)
    else:
        raise serializers.ValidationError(f"not JSON: {type(value).__name__}")


class WorkerSerializer(serializers.ModelSerializer):
    """A provider's machine with the figures of the provider page: price, measured throughput, unit cost,
    relay score, status and uptime."""

    unit_cost = serializers.FloatField(read_only=True, allow_null=True)
    provider = serializers.CharField(source="provider.user.username", read_only=True)
    # score, uptime and online_since are attached by selectors.workers_with_figures, for a whole page at once.
    score = serializers.FloatField(read_only=True, allow_null=True, help_text=(
        "Relay score in [0, 1] the broadcast planner ranks chain seeds by (paper appendix C.3: bandwidth, "
        "successful relays, recent failures, recency); null without a relay address."))
    uptime = serializers.FloatField(read_only=True, allow_null=True, help_text=(
        "Share of the last 7 days (or since registration, if younger) the agent was connected."))
    online_since = serializers.DateTimeField(read_only=True, allow_null=True,
                                             help_text="Start of the current connection; null while offline.")
    job_state = serializers.ChoiceField(
        choices=Activation.State.choices, read_only=True, allow_null=True, help_text=(
            "What the site last saw the worker do in its job (leases, accepted groups, installs; billed only while "
            "generating or installing), never what its heartbeats claim; null outside a job."))
    job_state_reason = serializers.CharField(read_only=True, help_text="Why the job state is failed, if it is.")
    audit_pass_rate = serializers.FloatField(read_only=True, allow_null=True, help_text=(
        "Share of its audited groups the learners found right (docs/trust.md \"Audits\"); null before any audit."))
    hardware = serializers.JSONField(read_only=True, help_text=(
        "What the machine has, as its agent measured it (dataplane/hardware.py: gpus [name, memory_gb, "
        "capability], cuda, driver, engines, cpu_count, ram_gb, disk_free_gb); claims used only for matching jobs' "
        "requirements; {} if never reported."))
    allow_user_code = serializers.BooleanField(read_only=True, allow_null=True, help_text=(
        "Whether its provider runs job owners' code on it (echo2-agent run --allow-user-code), as its agent's last "
        "hello said: jobs naming user code are matched only to workers that did not say false (docs/trust.md "
        "\"User code on workers\"); null: its agent never said (older)."))
    reliability = serializers.JSONField(read_only=True, allow_null=True, help_text=(
        "The long-run reliability figure in [0, 1] the scheduler weighs a_i mu_i by and jobs filter on "
        "(min_reliability), with its parts (marketplace/core/reliability.py; docs/scheduling.md \"Reliability\")."))

    class Meta:
        model = Worker
        fields = ["id", "provider", "name", "gpu", "price_per_hour", "bandwidth_bps", "measured_bandwidth_bps",
                  "relay_address", "status", "last_heartbeat", "throughput", "unit_cost", "score", "uptime",
                  "online_since", "job_state", "job_state_reason", "installed_version", "audits_passed",
                  "audits_failed", "audit_pass_rate", "suspended_at", "suspended_reason", "paused_at",
                  "removed_at", "hardware", "hardware_at", "allow_user_code",
                  "reliability", "created_at"]
        read_only_fields = ["status", "last_heartbeat", "throughput", "measured_bandwidth_bps", "installed_version",
                            "audits_passed", "audits_failed", "suspended_at", "suspended_reason", "paused_at",
                            "removed_at", "hardware_at", "created_at"]


class CalibrationSerializer(serializers.ModelSerializer):
    task = serializers.JSONField(write_only=True, help_text='Task spec benchmarked, e.g. {"name": "arithmetic"}.')

    class Meta:
        model = WorkerCalibration
        fields = ["model_dir", "task", "task_name", "throughput", "tokens_per_s", "measured_at"]
        read_only_fields = ["task_name", "measured_at"]
        extra_kwargs = {"throughput": {"min_value": 1e-9, "max_value": MAX_THROUGHPUT},
                        "tokens_per_s": {"min_value": 0, "max_value": 1e12}}

    def validate(self, attrs):
        for name in ("throughput", "tokens_per_s"):  # NaN passes every min/max comparison
            value = attrs.get(name)
            if value is not None and not math.isfinite(value):
                raise serializers.ValidationError({name: "must be a finite number"})
        return attrs


class WorkerRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    gpu = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=Decimal("0.0001"),
                                              help_text="c_i in USD per hour (> 0).")
    bandwidth_bps = serializers.IntegerField(min_value=1, max_value=MAX_BANDWIDTH_BPS,
                                             help_text="Link bandwidth in bytes/s.")
    relay_address = serializers.CharField(max_length=200, required=False, allow_blank=True, default="",
                                          help_text="host:port where chain peers reach this machine; public "
                                                    "addresses only, unless the site allows loopback or private "
                                                    "ones.")

    hardware = serializers.JSONField(required=False, default=None, help_text=(
        "What the machine has, as the agent measured it (dataplane/hardware.py); optional."))

    def validate_relay_address(self, value: str) -> str:
        return _peer_address(value)

    def validate_hardware(self, value) -> Hardware | None:
        if value is None:
            return None
        try:
            return parse_hardware(value)
        except ValueError as err:
            raise serializers.ValidationError(str(err)) from None


class WorkerRegisteredSerializer(WorkerSerializer):
    agent_key = serializers.CharField(read_only=True, help_text="Shown once; the agent authenticates with it.")

    class Meta(WorkerSerializer.Meta):
        fields = [*WorkerSerializer.Meta.fields, "agent_key"]


def _run_field(serializer: serializers.Serializer, name: str, field: serializers.Field, data: Mapping):
    """One field's value from ``data`` as DRF checks it: the field's own checks, then ``validate_<name>``."""
    value = field.run_validation(data.get(name, empty))
    check = getattr(serializer, f"validate_{name}", None)
    return check(value) if check else value


class JobSerializer(serializers.ModelSerializer):
    """A job: its settings, one field per JobSpec field (type, default, bounds and help from JobSpec), then what
    the site keeps about its life."""

    owner = serializers.CharField(source="owner.username", read_only=True)

    class Meta:
        model = Job
        fields = ["id", "owner", *JobSpec.model_fields, "status", "status_reason", "reason_code",
                  "created_at", "started_at", "finished_at", "archived_at", "learner_step", "published_version",
                  "learner_relay", "base_digest", "vocab_size"]
        read_only_fields = ["status", "status_reason", "reason_code", "created_at", "started_at", "finished_at",
                            "archived_at", "learner_step", "published_version", "learner_relay", "base_digest",
                            "vocab_size"]

    def get_fields(self) -> dict[str, serializers.Field]:
        """The job settings' fields are JobSpec's (``spec_fields``), in the place ``Meta.fields`` gives them, each
        read from the job's typed settings (``job.settings.kappa``)."""
        fields = super().get_fields()
        for name, field in spec_fields.serializer_fields(JobSpec).items():
            field.source = f"settings.{name}"
            fields[name] = field
        return fields

    def build_field(self, field_name, info, model_class, nested_depth):
        """A job setting is no column of ``Job``: a placeholder here, which :meth:`get_fields` replaces by JobSpec's
        own field."""
        if field_name in JobSpec.model_fields:
            return serializers.ReadOnlyField, {}
        return super().build_field(field_name, info, model_class, nested_depth)

    def to_internal_value(self, data):
        """The body is a JobSpec (plus this serializer's own settings, such as a plan's estimates): unknown keys are
        refused with the nearest known name, and every bad field is reported at once, not the first of them only.
        DRF's per-column checks would drop unknown keys and stop before JobSpec's checks run."""
        if not isinstance(data, Mapping):
            raise serializers.ValidationError({"non_field_errors": [
                f"Invalid data. Expected a dictionary, but got {type(data).__name__}."]})
        own = {name: field for name, field in self.fields.items() if name not in JobSpec.model_fields}
        errors: dict[str, list[str]] = {}
        values = {}
        for name, field in own.items():
            if field.read_only:
                if name in data:
                    errors[name] = ["read-only: set by the site, not a job setting"]
                continue
            try:
                values[name] = _run_field(self, name, field, data)
            except serializers.ValidationError as err:
                errors[name] = err.detail if isinstance(err.detail, list) else [err.detail]
        try:
            values["spec"] = parse_job_spec({k: v for k, v in data.items() if k not in own})
        except JobSpecError as err:
            errors = err.by_field() | errors
        if errors:
            raise serializers.ValidationError(errors)
        return values


class JobPlanRequestSerializer(JobSerializer):
    """A job's settings as for creating it, plus estimates of what only a running job measures."""

    t_train_s = serializers.FloatField(required=False, allow_null=True, default=None, max_value=MAX_SECONDS,
                                       help_text="Expected T_train, seconds per learner step (> 0); default: "
                                                 "measured by an earlier job of the same model and task.")
    t_bcast_s = serializers.FloatField(required=False, allow_null=True, default=None, max_value=MAX_SECONDS,
                                       help_text="Expected T_bcast, seconds per snapshot broadcast (>= 0); "
                                                 "default: measured by that earlier job, else 0.")

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "t_train_s", "t_bcast_s"]

    def validate_t_train_s(self, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= MIN_STEP_SECONDS):
            raise serializers.ValidationError(f"must be a number of seconds >= {MIN_STEP_SECONDS:g}")
        return value

    def validate_t_bcast_s(self, value: float | None) -> float | None:
        if value is not None and not (math.isfinite(value) and value >= 0):
            raise serializers.ValidationError("must be a number of seconds >= 0")
        return value


# The capacity plan's shape (scheduling.capacity_plan), for the OpenAPI schema only.


class MetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobMetric
        fields = ["step", "reward_mean", "reward_std", "loss", "max_staleness", "dropped_stale", "t_train", "wait_s",
                  "extra", "created_at"]


def _figure(**bounds) -> serializers.FloatField:
    return serializers.FloatField(required=False, **{"min_value": -MAX_FIGURE, "max_value": MAX_FIGURE, **bounds})


class AuditEvidenceSerializer(serializers.Serializer):
    """What one audited group was checked for (learner/audit.py ``Verdict``): claimed against recomputed."""

    entry_id = serializers.RegexField(r"^[0-9]{1,20}-[0-9]{1,20}\Z", max_length=41, help_text="Its stream entry.")
    group_id = serializers.CharField(max_length=200, allow_blank=True)
    version = serializers.IntegerField(min_value=0, max_value=MAX_INT)
    check = serializers.ChoiceField(["text", "reward", "logprobs", "all"], help_text="What failed ('all': passed).")
    passed = serializers.BooleanField()
    record = serializers.IntegerField(min_value=0, max_value=100_000, required=False)
    claimed_reward, recomputed_reward = _figure(), _figure()
    claimed_logprob, recomputed_logprob = _figure(), _figure()
    logprob_gap = _figure(min_value=0)
    logprob_outside = _figure(min_value=0, max_value=1)
    text_at = serializers.IntegerField(min_value=0, max_value=1_000_000, required=False)
    claimed_text = serializers.CharField(max_length=64, required=False, allow_blank=True, trim_whitespace=False)
    decoded_text = serializers.CharField(max_length=64, required=False, allow_blank=True, trim_whitespace=False)

    def validate(self, attrs: dict) -> dict:
        if attrs["passed"] != (attrs["check"] == "all"):
            raise serializers.ValidationError({"check": "'all' for a group that passed, what failed otherwise"})
        return attrs


class AuditResultSerializer(serializers.Serializer):
    """One worker's audit outcomes since the learner's previous report (learner/audit.py)."""

    worker_id = serializers.IntegerField(min_value=1, max_value=MAX_INT)
    passed = serializers.IntegerField(min_value=0, max_value=1_000_000)
    failed = serializers.IntegerField(min_value=0, max_value=1_000_000)
    dropped_records = serializers.IntegerField(min_value=0, max_value=MAX_INT, required=False, default=0)
    reason = serializers.CharField(max_length=500, required=False, allow_blank=True, default="")
    evidence = AuditEvidenceSerializer(many=True, required=False, default=list, max_length=32,
                                       help_text="What was checked: each failed group, a few passed ones.")


class WorkerAuditSerializer(serializers.ModelSerializer):
    """One step's audits of a worker as the site stored them, each failure with the site's own check of it
    (docs/trust.md "Audits the site checks"): ``site`` verified / consistent / unverified / refused, and why."""

    failures = serializers.SerializerMethodField(help_text=(
        "Each failure the learner gave evidence for: what it checked (entry, check, claimed against recomputed) and "
        "the site's verdict (site, site_reason). Failures beyond these came without evidence (unverified)."))

    class Meta:
        model = WorkerAudit
        fields = ["id", "job", "step", "passed", "failed", "failed_verified", "failed_consistent", "failed_unverified",
                  "failed_refused", "dropped_records", "reason", "failures", "created_at"]
        read_only_fields = fields

    def get_failures(self, row: WorkerAudit) -> list[dict]:
        return [e for e in row.evidence if not e.get("passed")]


class MetricReportSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=1, max_value=MAX_INT)
    reward_mean = serializers.FloatField(min_value=-MAX_FIGURE, max_value=MAX_FIGURE)
    reward_std = serializers.FloatField(required=False, default=0.0, min_value=0, max_value=MAX_FIGURE)
    loss = serializers.FloatField(required=False, default=0.0, min_value=-MAX_FIGURE, max_value=MAX_FIGURE)
    max_staleness = serializers.IntegerField(min_value=0, max_value=MAX_INT, required=False, default=0)
    dropped_stale = serializers.IntegerField(min_value=0, max_value=MAX_INT, required=False, default=0)
    t_train = serializers.FloatField(min_value=0, max_value=MAX_SECONDS, required=False, default=0.0,
                                     validators=[lambda v: _step_seconds(v, unknown=0.0)])
    wait_s = serializers.FloatField(min_value=0, max_value=MAX_SECONDS, required=False, default=0.0)
    extra = serializers.DictField(required=False, default=dict, validators=[_bounded_extra])
    audits = AuditResultSerializer(many=True, required=False, default=list, max_length=10_000,
                                   help_text="Audit outcomes per worker since the previous report; the site "
                                             "checks each failure against the group it stored, and a worker past "
                                             "ECHO2_AUDIT_SUSPEND_AFTER failures that count is suspended "
                                             "(docs/trust.md \"Audits the site checks\").")
    samples = sample_rows_field()


class SnapshotSerializer(serializers.ModelSerializer):
    class Meta:
        model = Snapshot
        fields = ["version", "url", "manifest", "published_at", "installs", "installs_via_parent", "t_bcast",
                  "n_chains"]
        read_only_fields = ["published_at", "installs", "installs_via_parent", "t_bcast", "n_chains"]
        extra_kwargs = {"version": {"min_value": 0, "max_value": MAX_INT}}

    def validate_manifest(self, value):
        # a list or a number reached the service's manifest.get(...) and was a 500
        if not isinstance(value, Mapping):
            raise serializers.ValidationError(f"must be an object (its manifest), not {type(value).__name__}")
        return value

    n_chains = serializers.SerializerMethodField(help_text="Chains of the broadcast plan (0: every worker pulls "
                                                 "over HTTP); set on the publish reply only.")

    def get_n_chains(self, snap) -> int | None:
        return getattr(snap, "n_chains", None)

    def validate_url(self, value: str) -> str:
        return _peer_address(value, url=True)


class LearnerAnnounceSerializer(serializers.Serializer):
    t_train = serializers.FloatField(min_value=0, max_value=MAX_SECONDS, required=False, allow_null=True, default=None,
                                     validators=[lambda v: _step_seconds(v, unknown=0.0)])
    relay_address = serializers.CharField(max_length=200, required=False, allow_null=True, allow_blank=True,
                                          default=None, help_text=(
                                              "host:port of the learner's relay hub (chain broadcast); empty: it "
                                              "runs none (a star strategy), so every worker fetches over HTTP."))
    vocab_size = serializers.IntegerField(min_value=1, max_value=MAX_VOCAB, required=False, allow_null=True,
                                          default=None, help_text=(
                                              "Rows of the model's token embedding: the site refuses returned token "
                                              "ids at or above it (docs/trust.md)."))

    def validate_relay_address(self, value: str | None) -> str | None:
        return _peer_address(value)


class LearnerAnnouncedSerializer(JobSerializer):
    """The reply to the learner's announcement: the job, and the secret its credentials are signed with."""

    transfer_secret = serializers.CharField(read_only=True, help_text=(
        "The job's transfer secret: the learner verifies workers' credentials with it (docs/trust.md). Only in "
        "this reply, to the job's owner."))

    class Meta(JobSerializer.Meta):
        fields = [*JobSerializer.Meta.fields, "transfer_secret"]


class LearnerStreamsSerializer(serializers.Serializer):
    """A learner's door to its job's streams (docs/trust.md "The learner's door"): made fresh at each call."""

    url = serializers.CharField(read_only=True, help_text=(
        "The Redis URL the learner connects with, its user and password in it (rediss:// where the site serves TLS). "
        "Only in this reply, to the job's owner; the previous learner's password is refused from now on."))
    username = serializers.CharField(read_only=True, help_text="The Redis user (the job's learner user).")
    isolated = serializers.BooleanField(read_only=True, help_text=(
        "True: a user whose keys are this job's alone. False: the site's own streams URL, full rights (no ACLs here, "
        "or the site opted out); ``reason`` says why."))
    reason = serializers.CharField(read_only=True, help_text="Why the door is not isolated; empty when it is.")


class JobFinishSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["completed", "failed"])
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)

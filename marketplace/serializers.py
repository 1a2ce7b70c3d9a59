"""API shapes. Validation of job fields is delegated to dataplane.jobs.JobSpec (one definition)."""

from __future__ import annotations

from decimal import Decimal

from rest_framework import serializers

from dataplane.jobs import JobSpec, JobSpecError, parse_job_spec

from .models import Job, JobMetric, Snapshot, Worker, WorkerCalibration


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

    class Meta:
        model = Worker
        fields = ["id", "provider", "name", "gpu", "price_per_hour", "bandwidth_bps", "relay_address", "status",
                  "last_heartbeat", "throughput", "unit_cost", "score", "uptime", "online_since",
                  "installed_version", "created_at"]
        read_only_fields = ["status", "last_heartbeat", "throughput", "installed_version", "created_at"]


class CalibrationSerializer(serializers.ModelSerializer):
    task = serializers.JSONField(write_only=True, help_text='Task spec benchmarked, e.g. {"name": "arithmetic"}.')

    class Meta:
        model = WorkerCalibration
        fields = ["model_dir", "task", "task_name", "throughput", "tokens_per_s", "measured_at"]
        read_only_fields = ["task_name", "measured_at"]
        extra_kwargs = {"throughput": {"min_value": 1e-9}, "tokens_per_s": {"min_value": 0}}


class WorkerRegisterSerializer(serializers.Serializer):
    name = serializers.CharField(max_length=100)
    gpu = serializers.CharField(max_length=100, required=False, allow_blank=True, default="")
    price_per_hour = serializers.DecimalField(max_digits=10, decimal_places=4, min_value=Decimal("0.0001"),
                                              help_text="c_i in USD per hour (> 0).")
    bandwidth_bps = serializers.IntegerField(min_value=1, help_text="Link bandwidth in bytes/s.")
    relay_address = serializers.CharField(max_length=200, required=False, allow_blank=True, default="")


class WorkerRegisteredSerializer(WorkerSerializer):
    agent_key = serializers.CharField(read_only=True, help_text="Shown once; the agent authenticates with it.")

    class Meta(WorkerSerializer.Meta):
        fields = [*WorkerSerializer.Meta.fields, "agent_key"]


class JobSerializer(serializers.ModelSerializer):
    owner = serializers.CharField(source="owner.username", read_only=True)

    class Meta:
        model = Job
        fields = ["id", "owner", "name", "model_dir", "task", "staleness", "kappa", "batch_trajectories",
                  "group_size", "gamma", "learner_uplink_bps", "learning_rate", "clip_eps", "max_steps",
                  "max_new_tokens", "temperature", "top_p", "seed", "target_reward", "loss", "broadcast_strategy",
                  "status", "status_reason",
                  "created_at", "started_at", "finished_at", "learner_step", "published_version",
                  "learner_relay"]
        read_only_fields = ["status", "status_reason", "created_at", "started_at", "finished_at", "learner_step",
                            "published_version", "learner_relay"]
        extra_kwargs = {f: {"required": False} for f in JobSpec.model_fields
                        if f not in {"name", "model_dir", "task"}}

    def validate(self, attrs):
        raw = {k: v for k, v in attrs.items() if v is not None}
        try:
            spec = parse_job_spec(raw)
        except JobSpecError as err:
            raise serializers.ValidationError({err.field: [err.message]}) from None
        attrs["spec"] = spec
        return attrs


class MetricSerializer(serializers.ModelSerializer):
    class Meta:
        model = JobMetric
        fields = ["step", "reward_mean", "reward_std", "loss", "max_staleness", "dropped_stale", "t_train", "wait_s",
                  "extra", "created_at"]


class MetricReportSerializer(serializers.Serializer):
    step = serializers.IntegerField(min_value=1)
    reward_mean = serializers.FloatField()
    reward_std = serializers.FloatField(required=False, default=0.0)
    loss = serializers.FloatField(required=False, default=0.0)
    max_staleness = serializers.IntegerField(min_value=0, required=False, default=0)
    dropped_stale = serializers.IntegerField(min_value=0, required=False, default=0)
    t_train = serializers.FloatField(min_value=0, required=False, default=0.0)
    wait_s = serializers.FloatField(min_value=0, required=False, default=0.0)
    extra = serializers.DictField(required=False, default=dict)


class SnapshotSerializer(serializers.ModelSerializer):
    class Meta:
        model = Snapshot
        fields = ["version", "url", "manifest", "published_at", "installs", "installs_via_parent", "t_bcast",
                  "n_chains"]
        read_only_fields = ["published_at", "installs", "installs_via_parent", "t_bcast", "n_chains"]

    n_chains = serializers.SerializerMethodField(help_text="Chains of the broadcast plan (0: every worker pulls "
                                                 "over HTTP); set on the publish reply only.")

    def get_n_chains(self, snap) -> int | None:
        return getattr(snap, "n_chains", None)


class LearnerAnnounceSerializer(serializers.Serializer):
    t_train = serializers.FloatField(min_value=0, required=False, allow_null=True, default=None)
    relay_address = serializers.CharField(max_length=200, required=False, allow_null=True, default=None,
                                          help_text="host:port of the learner's relay hub (chain broadcast).")


class JobFinishSerializer(serializers.Serializer):
    status = serializers.ChoiceField(choices=["completed", "failed"])
    reason = serializers.CharField(required=False, allow_blank=True, default="", max_length=500)

from django.contrib import admin

from .models import Activation, Job, JobMetric, Provider, Snapshot, Worker, WorkerAudit, WorkerSession
from .services.audits import provider_lift_suspension


@admin.register(Provider)
class ProviderAdmin(admin.ModelAdmin):
    list_display = ("id", "user", "display_name", "suspended_at", "suspended_reason", "created_at")
    list_filter = (("suspended_at", admin.EmptyFieldListFilter),)
    actions = ["lift_suspension"]

    @admin.action(description="Lift the suspension (the account and all its workers)")
    def lift_suspension(self, request, queryset) -> None:
        for provider in queryset:
            provider_lift_suspension(provider=provider)


@admin.register(Worker)
class WorkerAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "provider", "gpu", "price_per_hour", "throughput", "status", "last_heartbeat",
                    "audits_passed", "audits_failed", "suspended_at")
    list_filter = ("status",)
    exclude = ("key_hash",)


@admin.register(WorkerSession)
class WorkerSessionAdmin(admin.ModelAdmin):
    list_display = ("id", "worker", "started_at", "ended_at")


@admin.register(Job)
class JobAdmin(admin.ModelAdmin):
    list_display = ("id", "name", "owner", "status", "learner_step", "published_version", "created_at")
    list_filter = ("status",)


@admin.register(Activation)
class ActivationAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "worker", "price_per_hour", "started_at", "ended_at")


@admin.register(Snapshot)
class SnapshotAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "version", "published_at", "installs", "t_bcast")


@admin.register(JobMetric)
class JobMetricAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "step", "reward_mean", "max_staleness", "t_train", "wait_s")


@admin.register(WorkerAudit)
class WorkerAuditAdmin(admin.ModelAdmin):
    list_display = ("id", "job", "worker", "step", "passed", "failed", "failed_verified", "failed_consistent",
                    "failed_unverified", "failed_refused", "dropped_records", "reason")
    list_filter = ("worker",)
    # what the learner checked, each failure with the site's verdict (site, site_reason), and the site's counts
    readonly_fields = ("evidence", "failed_verified", "failed_consistent", "failed_unverified", "failed_refused")

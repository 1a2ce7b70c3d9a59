"""Health checks and Prometheus metrics for operators.

- ``GET /healthz``: the process answers (liveness: restart it when this fails). No I/O.
- ``GET /readyz``: the site can serve (readiness: send it traffic): the database answers, Redis answers,
  and Celery ran its beat recently (``replan_running_jobs`` stamps it every 5 s; older than
  ``ECHO2_CELERY_STALE_S``, 30 s, means beat or every worker is down): the checks are ``infra/probes.py``'s.
  200 or 503, with a JSON body naming each check.
- ``GET /metrics``: Prometheus text format (``prometheus_client``), computed at scrape time from the database
  and Redis: jobs by status, and per running/paused/stalled job its step, reward, largest staleness trained,
  bubble of the last step, pool throughput, active workers, cost and the replay buffer's counters. It
  names jobs and figures of every owner, so it wants ``Authorization: Bearer $ECHO2_METRICS_TOKEN`` or a
  staff session; without either it answers 403 with the reason.
"""

from __future__ import annotations

import hmac

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.http import require_GET
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from dataplane.replay import RedisError

from ..infra import probes, refusals, stream
from ..models import Job
from ..reads import selectors

LIVE_STATUSES = (Job.Status.RUNNING, Job.Status.PAUSED, Job.Status.STALLED)


@require_GET
def healthz(request: HttpRequest) -> JsonResponse:
    return JsonResponse({"status": "ok"})


@require_GET
def readyz(request: HttpRequest) -> JsonResponse:
    checks = probes.checks()
    ready = all(v.startswith("ok") for v in checks.values())
    return JsonResponse({"status": "ready" if ready else "not ready", "checks": checks}, status=200 if ready else 503)


def _allowed(request: HttpRequest) -> str | None:
    """None when the caller may scrape, else the reason it may not."""
    token = settings.ECHO2["METRICS_TOKEN"]
    header = request.headers.get("Authorization", "")
    if token and header.startswith("Bearer ") and hmac.compare_digest(header[7:].encode(), token.encode()):
        return None
    if request.user.is_authenticated and request.user.is_staff:
        return None
    return ("metrics need 'Authorization: Bearer <ECHO2_METRICS_TOKEN>' or a staff session"
            if token else "metrics need a staff session (set ECHO2_METRICS_TOKEN to scrape with a bearer token)")


class _SiteCollector:
    """Every figure read at scrape time: nothing is kept between scrapes."""

    GAUGES = {  # job_summary key -> (metric, help)
        "step": ("echo2_job_step", "Learner steps trained."),
        "reward_mean": ("echo2_job_reward_mean", "Mean reward of the last step."),
        "max_staleness": ("echo2_job_max_staleness", "Largest version lag trained on over the run."),
        "bubble_ratio": ("echo2_job_bubble_ratio", "wait / (wait + T_train) of the last step."),
        "pool_throughput": ("echo2_job_pool_throughput", "Trajectories/s the site accepted from the active pool."),
        "active_workers": ("echo2_job_active_workers", "Workers active in the job."),
        "cost_usd": ("echo2_job_cost_usd", "Cost billed so far, USD."),
        "published_version": ("echo2_job_published_version", "Newest snapshot version published."),
    }
    COUNTERS = ("accepted_records", "rejected_records", "accepted_groups")

    def collect(self):
        by_status = GaugeMetricFamily("echo2_jobs", "Jobs by status.", labels=["status"])
        counts = dict.fromkeys(Job.Status.values, 0)
        for status in Job.objects.values_list("status", flat=True):
            counts[status] = counts.get(status, 0) + 1
        for status, n in counts.items():
            by_status.add_metric([status], n)
        yield by_status
        gauges = {k: GaugeMetricFamily(name, text, labels=["job"]) for k, (name, text) in self.GAUGES.items()}
        counters = {k: CounterMetricFamily(f"echo2_job_{k}", f"Replay buffer counter {k}.", labels=["job"])
                    for k in self.COUNTERS}
        for job in Job.objects.filter(status__in=LIVE_STATUSES).order_by("pk"):
            summary = selectors.job_summary(job)
            for key, family in gauges.items():
                if summary.get(key) is not None:
                    family.add_metric([str(job.pk)], float(summary[key]))
            try:
                found = stream.replay(job.pk).counters()
            except RedisError:
                found = {}
            for key, family in counters.items():
                family.add_metric([str(job.pk)], float(found.get(key, 0)))
        yield from gauges.values()
        yield from counters.values()
        refused = CounterMetricFamily("echo2_agent_frames_refused", "Agent frames refused for the connection's rate "
                                      "budget (each sent again; honest agents pace themselves to meet none).",
                                      labels=["worker"])
        for worker_id, count in sorted(refusals.counts().items()):
            refused.add_metric([str(worker_id)], float(count))
        yield refused


@require_GET
def metrics(request: HttpRequest) -> HttpResponse:
    reason = _allowed(request)
    if reason is not None:
        return JsonResponse({"detail": reason}, status=403)
    registry = CollectorRegistry(auto_describe=False)
    registry.register(_SiteCollector())
    return HttpResponse(generate_latest(registry), content_type=CONTENT_TYPE_LATEST)

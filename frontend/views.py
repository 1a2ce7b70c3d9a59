"""Dashboard pages. They read through marketplace selectors, the same rules as the API."""

from __future__ import annotations

from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, render

from marketplace import selectors
from marketplace.serializers import MetricSerializer


@login_required
def job_list(request):
    jobs = selectors.jobs_visible_to(request.user).select_related("owner")
    return render(request, "frontend/job_list.html", {"jobs": jobs})


@login_required
def job_detail(request, job_id: int):
    job = get_object_or_404(selectors.jobs_visible_to(request.user), pk=job_id)
    metrics = MetricSerializer(job.metrics.order_by("step"), many=True).data
    context = {
        "job": job,
        "summary": selectors.job_summary(job),
        "metrics": [{"step": m["step"], "reward_mean": m["reward_mean"]} for m in metrics],
        "workers": [a.worker for a in job.activations.filter(ended_at=None).select_related("worker")],
    }
    return render(request, "frontend/job_detail.html", context)


@login_required
def provider_workers(request):
    workers = selectors.workers_visible_to(request.user).filter(provider__user=request.user)
    return render(request, "frontend/provider_workers.html", {"workers": workers,
                                                              "server": request.build_absolute_uri("/")})

"""The provider's and owner's controls on the pages (docs/ledger.md): a worker's price, pause, resume and removal on
the provider page; a job's budget, archive and delete on the job page. Each is a POST calling one service, its
refusal shown as a message naming what was wrong."""

from __future__ import annotations

from decimal import Decimal, InvalidOperation

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.shortcuts import get_object_or_404, redirect
from django.views.decorators.http import require_POST

from marketplace import services
from marketplace.reads import selectors


def _number(text: str, field: str) -> Decimal:
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise services.ServiceError(f"{field}: must be a number") from None
    if not value.is_finite():
        raise services.ServiceError(f"{field}: must be a number")
    return value


@login_required
@require_POST
def worker_control(request, worker_id: int, verb: str):
    """Price (from now on), pause, resume or remove one of the provider's own workers."""
    worker = get_object_or_404(selectors.workers_visible_to(request.user).filter(provider__user=request.user),
                               pk=worker_id)
    actions = {
        "price": lambda: services.worker_price_set(
            worker=worker, price_per_hour=_number(request.POST.get("price_per_hour", ""), "price_per_hour")),
        "pause": lambda: services.worker_pause(worker=worker),
        "resume": lambda: services.worker_resume(worker=worker),
        "remove": lambda: services.worker_remove(worker=worker),
    }
    try:
        actions[verb]()
        messages.success(request, f"{worker.name}: {verb} done.")
    except services.ServiceError as err:
        messages.error(request, f"Cannot {verb} {worker.name}: {err}")
    return redirect("frontend:provider-workers")


@login_required
@require_POST
def job_manage(request, job_id: int, verb: str):
    """Set the budget of, archive, unarchive or delete one of the owner's jobs."""
    job = get_object_or_404(selectors.jobs_visible_to(request.user).filter(owner=request.user), pk=job_id)
    try:
        if verb == "budget":
            text = request.POST.get("budget_usd", "").strip()
            services.job_budget_set(job=job, budget_usd=float(_number(text, "budget_usd")) if text else None)
        elif verb == "delete":
            services.job_delete(job=job)
            messages.success(request, f"Job #{job_id} deleted.")
            return redirect("frontend:job-list")
        else:
            services.job_archive(job=job, archived=verb == "archive")
    except services.ServiceError as err:
        messages.error(request, f"Cannot {verb}: {err}")
    return redirect("frontend:job-detail", job_id=job_id)

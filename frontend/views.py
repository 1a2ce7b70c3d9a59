"""Dashboard pages. They read through marketplace selectors, the same rules as the API."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied
from django.db import transaction
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from dataplane.learner_command import learner_command
from marketplace import services
from marketplace.api.samples import SampleQuerySerializer
from marketplace.models import Job, Worker
from marketplace.reads import figures, matching, scheduling, selectors
from marketplace.services.audit_verify import audit_standing, recent_failures

from . import dist, provider
from .forms import JobLaunchForm, job_file_initial


@login_required
def home(request):
    """Where signing in lands: a provider with machines and no jobs on its provider page, everyone else (staff too:
    the list is their queue of every job) on the jobs."""
    user = request.user
    if (not user.is_staff and not selectors.jobs_visible_to(user).exists()
            and Worker.objects.filter(provider__user=user, removed_at=None).exists()):
        return redirect("frontend:provider-workers")
    return redirect("frontend:job-list")


@login_required
def job_list(request):
    """The jobs, archived ones only with ``?archived=1``."""
    archived = request.GET.get("archived") == "1"
    jobs = selectors.jobs_visible_to(request.user).select_related("owner")
    jobs = list(jobs if archived else jobs.filter(archived_at=None))
    for job in jobs:  # why a running job does not run now, and what it can be told to do (staff: every job's)
        job.waiting_reason = matching.job_waiting_reason(job)
        job.verbs = [(verb, label) for verb, label, when in CONTROLS if job.status in when.split()]
    return render(request, "frontend/job_list.html", {"jobs": jobs, "archived": archived})


# (verb, button, the statuses it shows in); job.js shows and hides them as the status changes.
# A failed job resumes from its learner's last checkpoint (restart the learner after resuming).
CONTROLS = [("start", "Start", "draft"), ("pause", "Pause", "running"), ("resume", "Resume", "paused failed"),
            ("cancel", "Cancel", "draft running paused stalled failed")]


@login_required
def job_detail(request, job_id: int):
    """The job page: rendered with the current state and history; job.js keeps it live over the socket."""
    job = get_object_or_404(selectors.jobs_visible_to(request.user), pk=job_id)
    live = selectors.job_live(job, since_step=job.learner_step)  # the steps themselves come in ``history``
    history = {
        "metrics": [selectors.metric_point(m) for m in job.metrics.order_by("step")],
        "snapshots": [selectors.snapshot_point(s) for s in job.snapshots.order_by("version")],
        "staleness": job.settings.staleness,
    }
    server = request.build_absolute_uri("/").rstrip("/")
    return render(request, "frontend/job_detail.html", {"job": job, "summary": live["summary"], "live": live,
                                                        "history": history, "controls": CONTROLS, "server": server,
                                                        "learner_command": learner_command(server=server,
                                                                                           job_id=job.pk),
                                                        "reward_window": figures.REWARD_WINDOW,
                                                        "t_train_steps": figures.T_TRAIN_STEPS,
                                                        **_samples(request, job)})


def _samples(request, job) -> dict:
    """The job's newest samples within the reward range the page's filter asks for (a bad bound is said, not
    applied)."""
    bounds = {k: v for k, v in request.GET.items() if k in ("min_reward", "max_reward") and v}
    query = SampleQuerySerializer(data={**bounds, "limit": 20})
    if not query.is_valid():
        field, problems = next(iter(query.errors.items()))
        return {"samples": _named(selectors.job_samples(job=job, limit=20)), "samples_filter": {},
                "samples_error": f"{field}: {problems[0]}"}
    return {"samples": _named(selectors.job_samples(job=job, **query.validated_data)),
            "samples_filter": query.validated_data}


def _named(samples: list) -> list:
    """Each sample with its worker's name, as the workers table names it (the learner reports the worker's id)."""
    names = dict(Worker.objects.filter(pk__in={s.worker for s in samples}).values_list("pk", "name"))
    for sample in samples:
        sample.worker_name = names.get(sample.worker, "unknown" if sample.worker else "")
    return samples


@login_required
def provider_workers(request, new_token: str | None = None):
    workers = selectors.workers_with_figures(selectors.workers_visible_to(request.user)
                                             .filter(provider__user=request.user, removed_at=None))
    earnings = selectors.worker_earnings(workers)
    failures = recent_failures([w.pk for w in workers])
    for worker in workers:
        worker.earnings = earnings.get(worker.pk, {"hours": 0.0, "earned_usd": 0.0})
        worker.audit_failures = failures.get(worker.pk, [])
        if worker.audit_failures or worker.suspended_at is not None:  # why it is (or is not) suspended
            worker.audit_standing = audit_standing(worker)
    provider.decorate(workers)
    return render(request, "frontend/provider_workers.html", {
        "workers": workers, "has_token": new_token is not None or selectors.user_has_api_token(request.user),
        "new_token": new_token, "server": request.build_absolute_uri("/"), **dist.install_context(request),
        "earnings_by_day": provider.earnings_by_day(request.user), "earnings_days": provider.EARNINGS_DAYS})


@login_required
@require_POST
def api_token(request):
    """Create the user's API token (the one ``echo2-agent register`` and the REST API take), or replace it: the
    old one stops working at once. Only its hash is stored, so this reply is the one place it is ever shown."""
    token = services.api_token_issue(user=request.user)
    messages.success(request, "A new API token was created; commands using the old one must be updated.")
    return provider_workers(request, new_token=token)


@login_required
def marketplace_overview(request):
    """Staff only: every worker by unit cost, and how much of the fleet is busy, now and per worker."""
    if not request.user.is_staff:
        raise PermissionDenied
    workers = selectors.workers_with_figures(Worker.objects.select_related("provider__user"))
    utilization = selectors.worker_utilization(workers)
    for worker in workers:
        worker.utilization = utilization[worker.pk]
    provider.decorate(workers)  # a declared GPU its agent did not measure is flagged here too
    workers.sort(key=lambda w: (w.unit_cost is None, w.unit_cost or 0.0))
    online = [w for w in workers if w.status != Worker.Status.OFFLINE]
    active = [w for w in workers if w.status == Worker.Status.ACTIVE]
    return render(request, "frontend/marketplace.html", {
        "workers": workers, "online": len(online), "active": len(active),
        "utilization": len(active) / len(online) if online else None,
    })


@login_required
def job_launch(request):
    """The launch form and, beside it, the capacity plan for the form's values.

    "Preview plan" (a second submit button, so it works without JavaScript) validates the form like a
    launch, shows the plan (``scheduling.spec_plan``) and creates nothing. Until then, and while the form
    has errors, the panel lists the workers available now. "Fill from file" fills the form from an uploaded
    TOML or YAML job file, or lists every problem with it.
    """
    if "load" in request.POST:  # "Fill from file": the form, filled from the uploaded job file; nothing launched
        initial, file_errors = job_file_initial(request.FILES.get("job_file"))
        form = JobLaunchForm(initial=initial)
        return render(request, "frontend/job_launch.html", {"form": form, "file_errors": file_errors,
                                                            "available": scheduling.available_workers()})
    form = JobLaunchForm(request.POST or None)
    plan = None
    if request.method == "POST" and form.is_valid():
        if "preview" not in request.POST:
            try:
                with transaction.atomic():
                    job = services.job_create(owner=request.user, spec=form.spec)
                    if form.cleaned_data["start_now"]:
                        services.job_start(job=job)
                return redirect("frontend:job-detail", job_id=job.pk)
            except services.ServiceError as err:  # the field it names gets the error, as a JobSpec error would
                field, _, reason = str(err).partition(": ")
                form.add_error(field if field in form.fields else None, reason or str(err))
        else:
            plan = scheduling.spec_plan(form.spec, user=request.user, t_train=form.cleaned_data["t_train_s"],
                                        t_bcast=form.cleaned_data["t_bcast_s"])
    available = None if plan else scheduling.available_workers()
    return render(request, "frontend/job_launch.html", {"form": form, "plan": plan, "available": available})


@login_required
@require_POST
def job_control(request, job_id: int, verb: str):
    """Start, pause, resume or cancel; a verb the job's state does not allow comes back as a message."""
    job = get_object_or_404(selectors.jobs_visible_to(request.user), pk=job_id)
    user = request.user.get_username()
    actions = {
        "start": lambda: services.job_start(job=job),
        "pause": lambda: services.job_pause(job=job, by=user),
        "resume": lambda: services.job_resume(job=job),
        "cancel": lambda: services.job_finish(job=job, status=Job.Status.CANCELLED, reason=f"cancelled by {user}",
                                              code=Job.Reason.BY_PERSON),
    }
    try:
        actions[verb]()  # each service runs in its own transaction
    except services.ServiceError as err:
        messages.error(request, f"Cannot {verb}: {str(err).partition(': ')[2] or err}")
    return redirect("frontend:job-detail", job_id=job.pk)

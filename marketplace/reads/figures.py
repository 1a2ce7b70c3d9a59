"""The job page's figures said for what they are, added to ``selectors.job_summary`` (so the page, the API
and ``echo2 job status`` show the same): the reward as the mean of the last steps as of a step, the throughput
target with how it was computed or, where there is none, why (the launch preview's words,
``provisioning.feasibility``), whether the site can serve the model's download now and, where it cannot, how to get
it, and whether the job is waiting for its learner. Reads only."""

from __future__ import annotations

import math

from django.conf import settings
from django.utils import timezone

from dataplane.timing import T_TRAIN_STEPS

from ..core import provisioning
from ..models import Job, JobMetric, Snapshot

REWARD_WINDOW = 10
"""Steps the headline reward averages: the window of the learner's ``target_reward`` check (learner/loop.py) and of
the demo's table."""


def reward_window(job: Job) -> tuple[float | None, int]:
    """The mean of the learner's reported ``reward_mean`` over the job's last :data:`REWARD_WINDOW` steps (fewer
    before it has that many), and how many steps that is; (None, 0) before its first step."""
    rewards = list(JobMetric.objects.filter(job=job).order_by("-step")
                   .values_list("reward_mean", flat=True)[:REWARD_WINDOW])
    return (math.fsum(rewards) / len(rewards) if rewards else None), len(rewards)


def target_line(job: Job, snap: Snapshot | None, pool_throughput: float,
                last: JobMetric | None = None) -> tuple[str, bool]:
    """How the throughput target ``gamma * mu_min`` (section 3.3) was computed from what was measured (it moves with
    every new T_train and T_bcast), or why there is none: no T_train yet, or a schedule no pool can keep up with
    (the launch preview's reason); and whether it is the latter (the page marks it). Ends with the feasibility
    report's verdict on the pool now. One T_train: the job's (dataplane/timing.py ``t_train``, as the learner
    announced it), the figure of the page's T_train card and of the plan; a verdict that the learner will idle says
    how long it actually waited at the last step (the page's learner-wait card), so the two never read as
    contradicting."""
    if not job.learner_t_train:
        return ("no target yet: T_train is not known (the learner measures it in its first steps); every available "
                "worker is used meanwhile"), False
    t_train, t_bcast = job.learner_t_train, (snap.t_bcast if snap else 0.0)
    spec = job.settings
    measured = (f"T_train {t_train:.3g} s (the median of the learner's last {T_TRAIN_STEPS} steps), "
                f"T_bcast {t_bcast:.3g} s "
                + (f"(snapshot v{snap.version})" if snap else "(no broadcast measured yet: 0 assumed)"))
    try:
        report = provisioning.feasibility(staleness=spec.staleness, kappa=spec.kappa, t_train=t_train, t_bcast=t_bcast,
                                          batch=spec.batch_trajectories, gamma=spec.gamma, mu_pool=pool_throughput)
    except provisioning.ProvisioningInputError as err:
        return f"no target: {err} ({measured})", True
    if report.target is None:
        return f"no target: {report.reason} ({measured})", True
    now = (f"Now: {report.reason}" if job.status == Job.Status.RUNNING
           else f"The job is {job.status}: no worker is planned for it.")
    if "will idle" in now and last is not None and last.t_train + last.wait_s > 0:
        now += (f" (by the model; measured at step {last.step}: it waited {last.wait_s:.3g} s, "
                f"{last.wait_s / (last.t_train + last.wait_s):.0%} of the step)")
    return (f"γ·μ_min = {spec.gamma:g} × κR/(κ·T_train − T_bcast) = {spec.gamma:g} × {spec.kappa}·"
            f"{spec.batch_trajectories}/({spec.kappa} × {t_train:.3g} − {t_bcast:.3g}) = {report.target:.4g} traj/s "
            f"from {measured}; it moves as they are measured again. {now}"), False


def learner_heard_recently(job: Job) -> bool:
    """The learner reported (announcement, heartbeat or step) within ``LEARNER_TIMEOUT_S``: it serves snapshots."""
    if job.learner_seen_at is None:
        return False
    age = (timezone.now() - job.learner_seen_at).total_seconds()
    return age <= settings.ECHO2["LEARNER_TIMEOUT_S"]


def offline_export(job: Job, version: int | None = None) -> str:
    """The command that exports ``job``'s model on its learner's machine, from the snapshot directory it wrote."""
    pinned = f" --version {version}" if version is not None else ""
    return (f"on the learner's machine, `echo2-learner export --job {job.pk}{pinned} --out models/job{job.pk}` reads "
            f"it from the directory the learner wrote (its --snapshot-dir, var/snapshots by default: job{job.pk}/ "
            f"holds the published versions; `--checkpoint` exports the last checkpoint, job{job.pk}-checkpoint/)")


def export_line(job: Job) -> str:
    """"" while the site can serve the model's download (the job runs and its learner was heard from lately: the site
    relays the weights from it and keeps none), else why not and how to get the model instead."""
    published = job.snapshots.exists()
    if job.is_terminal:
        newest = (f"v{job.published_version}, its final model (the learner publishes the last step when the job "
                  "completes)" if job.status == Job.Status.COMPLETED else f"v{job.published_version}")
        if not published:
            return f"Job {job.pk} ended without publishing a snapshot: there is no model to download."
        return (f"Job {job.pk} is {job.status}: its learner exited with it, and the site keeps no weights (it relays "
                f"them from the learner while the job runs), so the site cannot serve the download. The newest "
                f"snapshot is {newest}: {offline_export(job)}.")
    if not published:
        return ("Nothing to download yet: the learner publishes the base (version 0) when it starts, then a "
                f"snapshot every κ = {job.settings.kappa} steps.")
    if not learner_heard_recently(job):
        since = (f" since {job.learner_seen_at:%Y-%m-%d %H:%M:%S} UTC" if job.learner_seen_at else "")
        return (f"Its learner has not been heard from{since}, and the site relays the weights from it (it keeps "
                f"none): the download works again once the learner runs; meanwhile {offline_export(job)}.")
    return ""


def summary_figures(job: Job, *, last: JobMetric | None, snap: Snapshot | None, pool_throughput: float) -> dict:
    """What ``job_summary`` adds so that each figure says what it is: the reward's window and the step the step
    figures are as of, the snapshot T_bcast was measured on, the target's derivation, whether the job is over (the
    page shows final figures, no projection), the download's availability and the learner's absence."""
    mean, steps = reward_window(job)
    line, unmet = target_line(job, snap, pool_throughput, last)
    published = job.snapshots.exists()
    return {
        "reward_recent_mean": mean,
        "reward_recent_steps": steps,
        "as_of_step": last.step if last else None,  # the step reward, T_train, bubble and step time are of
        "published_of": f"v{job.published_version}" if published else "none published yet",  # v0: the base
        "t_bcast_version": snap.version if snap else None,
        "t_bcast_of": f"snapshot v{snap.version}" if snap else "no broadcast measured yet",
        "throughput_target_line": line,
        "throughput_target_unmet": unmet,  # T_train measured, yet no pool can meet the schedule: the line says why
        "final": job.is_terminal,
        "export_line": export_line(job),
        # started, and no learner ever reported (a stalled job too: it stalls when none does)
        "learner_waiting": job.status in (Job.Status.RUNNING, Job.Status.STALLED) and job.learner_seen_at is None,
    }

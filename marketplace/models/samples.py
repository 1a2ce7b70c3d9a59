"""Samples the learner reported (dataplane/samples.py): a few trained records of every N-th step, the newest
``SAMPLES_KEPT_PER_JOB`` per job. Imported by ``marketplace.models`` (Django finds the model there)."""

from __future__ import annotations

from django.db import models


class JobSample(models.Model):
    """One trained record as the owner reads it: the step that trained it, the version it was generated under,
    the worker (its id, as the site stamped the group), its reward, prompt and completion (cut by the learner)."""

    job = models.ForeignKey("marketplace.Job", on_delete=models.CASCADE, related_name="samples")
    step = models.PositiveIntegerField(help_text="The learner step that trained it.")
    version = models.PositiveIntegerField(help_text="The snapshot version it was generated under.")
    worker = models.PositiveIntegerField(help_text="Id of the worker that generated it (0: unknown).")
    reward = models.FloatField()
    prompt = models.TextField()
    completion = models.TextField()
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        ordering = ["-step", "id"]
        indexes = [models.Index(fields=["job", "-step"], name="sample_job_step")]

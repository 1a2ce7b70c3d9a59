"""A job's settings move into one JSON column, ``Job.spec`` (issue 27): JobSpec is their only definition.

Existing jobs get ``spec`` filled from their columns (which held every JobSpec field, resolved, as
``services.job_create`` wrote them); the columns go, except the ones the site filters by (name, model_dir, task).
Going back fills the columns from ``spec``, with the defaults they had here for a setting a job lacks.
"""

from django.db import migrations, models

# Every JobSpec field this migration moves, with the default it had here (for the way back only).
MOVED = {
    "staleness": 3, "kappa": 2, "batch_trajectories": 128, "group_size": 8, "gamma": 1.1,
    "learner_uplink_bps": 125_000_000, "learning_rate": 1e-3, "clip_eps": 0.2, "max_steps": 300, "max_new_tokens": 8,
    "temperature": 1.0, "top_p": 1.0, "seed": 0, "target_reward": None, "loss": {}, "broadcast_strategy": "chain",
    "snapshot_dtype": "bf16", "snapshot_full_every": 10,
}
KEPT = ("name", "model_dir", "task")


def columns_to_spec(apps, schema_editor):
    Job = apps.get_model("marketplace", "Job")
    for job in Job.objects.all().iterator():
        job.spec = {name: getattr(job, name) for name in (*KEPT, *MOVED)}
        job.save(update_fields=["spec"])


def spec_to_columns(apps, schema_editor):
    Job = apps.get_model("marketplace", "Job")
    for job in Job.objects.all().iterator():
        for name, default in MOVED.items():
            setattr(job, name, job.spec.get(name, default))
        job.save(update_fields=list(MOVED))


class Migration(migrations.Migration):

    dependencies = [
        ('marketplace', '0018_activation_observed_state'),
    ]

    operations = [
        migrations.AddField(
            model_name='job',
            name='spec',
            field=models.JSONField(default=dict, help_text="The job's settings (dataplane.jobs.JobSpec) as validated when it was created, every default filled in: what its job file and its learner read."),
        ),
        # Nullable first, so that the way back can add them to existing rows before it fills them.
        *[migrations.AlterField(model_name='job', name=name, field=field) for name, field in [
            ('staleness', models.PositiveIntegerField(null=True)),
            ('kappa', models.PositiveIntegerField(null=True)),
            ('batch_trajectories', models.PositiveIntegerField(null=True)),
            ('group_size', models.PositiveIntegerField(null=True)),
            ('learner_uplink_bps', models.BigIntegerField(null=True)),
        ]],
        migrations.RunPython(columns_to_spec, spec_to_columns),
        *[migrations.RemoveField(model_name='job', name=name) for name in MOVED],
    ]

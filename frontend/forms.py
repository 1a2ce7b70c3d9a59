"""The job launch form: every job setting with its default, validated by the same JobSpec as the API."""

from __future__ import annotations

import json

from django import forms

from dataplane.jobs import JobSpec, JobSpecError, parse_job_spec
from dataplane.tasks import available_tasks

_FIELDS = JobSpec.model_fields


def _help(name: str) -> str:
    return _FIELDS[name].description or ""


class JobLaunchForm(forms.Form):
    name = forms.CharField(max_length=100, help_text=_help("name"))
    model_dir = forms.CharField(max_length=500, label="Model directory", help_text=_help("model_dir"))
    task_name = forms.ChoiceField(label="Task", choices=(), help_text="Task adapter.")
    task_options = forms.CharField(required=False, label="Task options (JSON)", initial="{}",
                                   widget=forms.Textarea(attrs={"rows": 2}),
                                   help_text='e.g. {"max_operand": 4}')
    staleness = forms.IntegerField(label="S (staleness budget)", initial=3, help_text=_help("staleness"))
    kappa = forms.IntegerField(label="κ (snapshot period)", required=False, help_text=_help("kappa"))
    batch_trajectories = forms.IntegerField(label="R (trajectories per step)", initial=128,
                                            help_text=_help("batch_trajectories"))
    group_size = forms.IntegerField(label="n (group size)", initial=8, help_text=_help("group_size"))
    gamma = forms.FloatField(label="γ (safety factor)", initial=1.1, help_text=_help("gamma"))
    learner_uplink_mbps = forms.FloatField(label="B0 (learner uplink, Mbit/s)", initial=1000.0,
                                           help_text="Learner uplink; stored in bytes/s.")
    learning_rate = forms.FloatField(initial=1e-3, help_text=_help("learning_rate"))
    clip_eps = forms.FloatField(label="clip ε", initial=0.2, help_text=_help("clip_eps"))
    max_steps = forms.IntegerField(initial=300, help_text=_help("max_steps"))
    max_new_tokens = forms.IntegerField(initial=8, help_text=_help("max_new_tokens"))
    temperature = forms.FloatField(initial=1.0, help_text=_help("temperature"))
    top_p = forms.FloatField(initial=1.0, help_text=_help("top_p"))
    seed = forms.IntegerField(initial=0, help_text=_help("seed"))
    target_reward = forms.FloatField(required=False, help_text=_help("target_reward"))
    start_now = forms.BooleanField(required=False, initial=True, label="Start right away")

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["task_name"].choices = [(name, name) for name in sorted(available_tasks())]

    def clean(self):
        data = super().clean()
        if self.errors:
            return data
        try:
            options = json.loads(data.get("task_options") or "{}")
        except ValueError:
            self.add_error("task_options", "not valid JSON")
            return data
        if not isinstance(options, dict):
            self.add_error("task_options", "must be a JSON object")
            return data
        raw = {k: v for k, v in data.items() if k in _FIELDS and v is not None}
        raw["task"] = {"name": data["task_name"], **options}
        raw["learner_uplink_bps"] = int(data["learner_uplink_mbps"] * 1e6 / 8)
        try:
            self.spec = parse_job_spec(raw)
        except JobSpecError as err:
            field = {"task": "task_options", "learner_uplink_bps": "learner_uplink_mbps"}.get(err.field, err.field)
            self.add_error(field if field in self.fields else None, err.message)
        return data

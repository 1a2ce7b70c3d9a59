"""The job launch form: every job setting with its default, validated by the same JobSpec as the API."""

from __future__ import annotations

import json
import typing

from django import forms

from dataplane.jobfiles import JobFileError, file_kind, read_job_text
from dataplane.jobs import JobSpec, JobSpecError, LossConfig, parse_job_spec
from dataplane.losses import LOSS_TYPES
from dataplane.tasks import available_tasks

_FIELDS = JobSpec.model_fields
_LOSS = LossConfig.model_fields
MAX_JOB_FILE_BYTES = 64 * 1024
LOSS_PREFIX = "loss_"  # the form field of LossConfig's ``kl_beta`` is ``loss_kl_beta`` (JobSpecError: "loss.kl_beta")


def _help(name: str) -> str:
    return _FIELDS[name].description or ""


def _literal_choices(annotation: object) -> list[tuple[str, str]]:
    """The values of a ``Literal[...]`` (or ``Literal[...] | None``) pydantic field, as form choices."""
    if typing.get_origin(annotation) is typing.Literal:
        return [(value, value) for value in typing.get_args(annotation)]
    return [choice for arg in typing.get_args(annotation) for choice in _literal_choices(arg)]


def _loss_type_choices() -> list[tuple[str, str]]:
    """The declared policy-loss variants (dataplane/losses.py), read when a form is built."""
    return [(name, name) for name in LOSS_TYPES]


def _loss_field(name: str, field_class: type[forms.Field], label: str, **kwargs) -> forms.Field:
    """A LossConfig setting: optional (blank keeps LossConfig's default), shown with its default and its doc."""
    spec = _LOSS[name]
    if field_class is forms.ChoiceField and "choices" not in kwargs:
        choices = _literal_choices(spec.annotation)
        kwargs["choices"] = choices if spec.default is not None else [("", "default"), *choices]
    return field_class(label=label, required=False, initial=spec.default, help_text=spec.description or "", **kwargs)


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
    broadcast_strategy = forms.ChoiceField(label="Snapshot broadcast", required=False,
                                           choices=_literal_choices(_FIELDS["broadcast_strategy"].annotation),
                                           initial=_FIELDS["broadcast_strategy"].default,
                                           help_text=_help("broadcast_strategy"))
    snapshot_dtype = forms.ChoiceField(label="Snapshot dtype", required=False,
                                       choices=_literal_choices(_FIELDS["snapshot_dtype"].annotation),
                                       initial=_FIELDS["snapshot_dtype"].default, help_text=_help("snapshot_dtype"))
    snapshot_full_every = forms.IntegerField(label="K (a full snapshot every K versions)", required=False,
                                             initial=_FIELDS["snapshot_full_every"].default,
                                             help_text=_help("snapshot_full_every"))
    learning_rate = forms.FloatField(initial=1e-3, help_text=_help("learning_rate"))
    clip_eps = forms.FloatField(label="clip ε", initial=0.2, help_text=_help("clip_eps"))
    max_steps = forms.IntegerField(initial=300, help_text=_help("max_steps"))
    target_reward = forms.FloatField(required=False, help_text=_help("target_reward"))
    max_new_tokens = forms.IntegerField(initial=8, help_text=_help("max_new_tokens"))
    temperature = forms.FloatField(initial=1.0, help_text=_help("temperature"))
    top_p = forms.FloatField(initial=1.0, help_text=_help("top_p"))
    seed = forms.IntegerField(initial=0, help_text=_help("seed"))
    loss_type = _loss_field("type", forms.ChoiceField, "Loss", choices=_loss_type_choices)
    loss_advantage = _loss_field("advantage", forms.ChoiceField, "Advantage")
    loss_advantage_eps = _loss_field("advantage_eps", forms.FloatField, "Advantage ε")
    loss_clip_eps_low = _loss_field("clip_eps_low", forms.FloatField, "clip ε low")
    loss_clip_eps_high = _loss_field("clip_eps_high", forms.FloatField, "clip ε high")
    loss_kl_beta = _loss_field("kl_beta", forms.FloatField, "KL β")
    loss_aggregation = _loss_field("aggregation", forms.ChoiceField, "Aggregation")
    loss_norm_length = _loss_field("norm_length", forms.IntegerField, "Length normalizer")
    loss_off_policy = _loss_field("off_policy", forms.ChoiceField, "Off-policy correction")
    loss_is_cap = _loss_field("is_cap", forms.FloatField, "IS cap C")
    loss_max_grad_norm = _loss_field("max_grad_norm", forms.FloatField, "Max gradient norm")
    loss_dual_clip = _loss_field("dual_clip", forms.FloatField, "Dual-clip bound c")
    t_train_s = forms.FloatField(label="Expected T_train (s)", required=False,
                                 help_text="Seconds per learner step, for the plan only; blank: what an earlier "
                                           "job of this model and task measured, else the calibration phase.")
    t_bcast_s = forms.FloatField(label="Expected T_bcast (s)", required=False, min_value=0,
                                 help_text="Seconds per snapshot broadcast, for the plan only; blank: what an "
                                           "earlier job of this model and task measured, else 0.")
    start_now = forms.BooleanField(required=False, initial=True, label="Start right away")

    fieldsets = (
        ("Job", ("name", "model_dir", "task_name", "task_options", "start_now")),
        ("Staleness and capacity", ("staleness", "kappa", "batch_trajectories", "group_size", "gamma",
                                    "learner_uplink_mbps", "broadcast_strategy", "snapshot_dtype",
                                    "snapshot_full_every")),
        ("Training", ("learning_rate", "clip_eps", "max_steps", "target_reward")),
        ("Sampling", ("max_new_tokens", "temperature", "top_p", "seed")),
        ("Loss", tuple(LOSS_PREFIX + name for name in _LOSS)),
        ("Plan estimates (not saved with the job)", ("t_train_s", "t_bcast_s")),
    )

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.fields["task_name"].choices = [(name, name) for name in sorted(available_tasks())]

    def grouped(self) -> list[tuple[str, list[forms.BoundField]]]:
        """The fields by fieldset, as the template draws them."""
        return [(title, [self[name] for name in names]) for title, names in self.fieldsets]

    def clean_t_train_s(self) -> float | None:
        value = self.cleaned_data["t_train_s"]
        if value is not None and value <= 0:
            raise forms.ValidationError("must be a positive number of seconds")
        return value

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
        blank = (None, "")  # left blank: the JobSpec default
        raw = {k: v for k, v in data.items() if k in _FIELDS and v not in blank}
        raw["task"] = {"name": data["task_name"], **options}
        raw["learner_uplink_bps"] = int(data["learner_uplink_mbps"] * 1e6 / 8)
        raw["loss"] = {name: data[LOSS_PREFIX + name] for name in _LOSS if data[LOSS_PREFIX + name] not in blank}
        try:
            self.spec = parse_job_spec(raw)
        except JobSpecError as err:
            for name, message in err.errors:  # every one, by the form field that holds it
                field = {"task": "task_options", "learner_uplink_bps": "learner_uplink_mbps"}.get(
                    name, name.replace("loss.", LOSS_PREFIX))
                self.add_error(field if field in self.fields else None, message)
        return data


def job_file_initial(upload) -> tuple[dict, list[str]]:
    """The launch form's values from an uploaded TOML or YAML job file, and every problem with it.

    The file is checked by the same ``parse_job_spec`` as a launch (unknown keys with the nearest name, every
    bad field at once); the form is filled with what the file says, not the resolved spec, so that a default
    tied to another field (``loss.clip_eps_low``: clip ε) still follows it when that field is edited.
    """
    if upload is None:
        return {}, ["choose a .toml or .yaml job file first"]
    if upload.size > MAX_JOB_FILE_BYTES:
        return {}, [f"{upload.name}: larger than {MAX_JOB_FILE_BYTES // 1024} KiB; a job file is a few lines"]
    try:
        raw = read_job_text(upload.read().decode("utf-8"), kind=file_kind(upload.name), name=upload.name)
        parse_job_spec(raw)
    except UnicodeDecodeError:
        return {}, [f"{upload.name}: not UTF-8 text"]
    except JobFileError as err:
        return {}, [str(err)]
    except JobSpecError as err:
        return {}, [f"{field}: {message}" for field, message in err.errors]
    return _initial_from_raw(raw), []


def _initial_from_raw(raw: dict) -> dict:
    """A job file's settings as the launch form's fields (task name and options, Mbit/s, ``loss_*``)."""
    initial = {k: v for k, v in raw.items() if k in _FIELDS and not isinstance(v, dict) and v is not None}
    task = dict(raw["task"])
    initial["task_name"] = task.pop("name", "")
    initial["task_options"] = json.dumps(task)
    if "learner_uplink_bps" in raw:
        initial["learner_uplink_mbps"] = raw["learner_uplink_bps"] * 8 / 1e6
    initial |= {LOSS_PREFIX + k: v for k, v in (raw.get("loss") or {}).items() if v is not None}
    return initial

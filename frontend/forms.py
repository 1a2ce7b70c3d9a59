"""The job launch form: every job setting with its default, validated by the same JobSpec as the API."""

from __future__ import annotations

import json

from django import forms

from dataplane.jobfields import Setting, settings_of
from dataplane.jobfiles import JobFileError, file_kind, read_job_text
from dataplane.jobs import JobSpec, JobSpecError, LossConfig, parse_job_spec
from dataplane.tasks import available_tasks

_FIELDS = JobSpec.model_fields
_LOSS = LossConfig.model_fields
MAX_JOB_FILE_BYTES = 64 * 1024
LOSS_PREFIX = "loss_"  # the form field of LossConfig's ``kl_beta`` is ``loss_kl_beta`` (JobSpecError: "loss.kl_beta")
# The JobSpec settings that are tables of settings (``loss``, ``prompt_format``): one ``<table>_<name>`` form field
# per setting of the table.
_TABLES: dict[str, type] = {s.name: s.model for s in settings_of(JobSpec) if s.kind == "model"}
# JobSpec settings drawn by hand: ``task`` as a task name and its options, ``learner_uplink_bps`` in Mbit/s, and
# the tables. Every other JobSpec field is drawn from JobSpec alone.
_DRAWN_BY_HAND = ("task", "learner_uplink_bps", *_TABLES)
# How the page names a setting (its symbol in the paper); a setting not listed is named after its field.
LABELS = {
    "model_dir": "Model directory", "staleness": "S (staleness budget)", "kappa": "κ (snapshot period)",
    "batch_trajectories": "R (trajectories per step)", "group_size": "n (group size)", "gamma": "γ (safety factor)",
    "broadcast_strategy": "Snapshot broadcast", "snapshot_dtype": "Snapshot dtype",
    "snapshot_full_every": "K (a full snapshot every K versions; 0: none after the first)", "clip_eps": "clip ε",
    "loss_type": "Loss", "loss_advantage": "Advantage", "loss_advantage_eps": "Advantage ε",
    "loss_advantage_std": "Advantage std", "loss_clip_eps_low": "clip ε low", "loss_clip_eps_high": "clip ε high",
    "loss_kl_beta": "KL β",
    "loss_aggregation": "Aggregation", "loss_norm_length": "Length normalizer",
    "loss_off_policy": "Off-policy correction", "loss_is_cap": "IS cap C", "loss_max_grad_norm": "Max gradient norm",
    "loss_dual_clip": "Dual-clip bound c", "prompt_format_chat": "Chat template",
    "requirements_min_gpu_memory_gb": "GPU memory (GB)", "requirements_engine": "Engine",
    "requirements_max_price_per_hour": "Max price (USD/h)", "requirements_min_reliability": "Min reliability",
    "prompt_format_system_prompt": "System prompt", "budget_usd": "Budget (USD)",
}
_FORM_FIELDS: dict[str, type[forms.Field]] = {
    "int": forms.IntegerField, "float": forms.FloatField, "str": forms.CharField, "bool": forms.BooleanField,
    "choice": forms.ChoiceField, "json": forms.JSONField,  # a list (lora.target_modules) as JSON text
}


def _form_field(setting: Setting, name: str) -> forms.Field:
    """A JobSpec (or LossConfig) setting as a form field: its default shown, its help under it. Only a setting
    without a default is required; a blank one is the default. Bounds are JobSpec's to check (its message)."""
    kwargs: dict = {"required": setting.required, "help_text": setting.help}
    if name in LABELS:
        kwargs["label"] = LABELS[name]
    if setting.has_default and setting.default is not None:
        kwargs["initial"] = setting.default
    if setting.kind == "choice":  # read when a form is built: a registry's names (loss.type) may grow
        blank = [] if setting.required or setting.default is not None else [("", "default")]
        kwargs["choices"] = lambda: [*blank, *((value, value) for value in setting.choices)]
    elif setting.kind == "str":
        kwargs["max_length"] = setting.max_length
        if setting.max_length and setting.max_length > 1000:  # a paragraph (a system prompt)
            kwargs["widget"] = forms.Textarea(attrs={"rows": 3})
    return _FORM_FIELDS[setting.kind](**kwargs)


def _spec_form_fields() -> dict[str, forms.Field]:
    """Every JobSpec setting not drawn by hand, then every setting of each table as ``<table>_<name>``
    (``loss_kl_beta``)."""
    fields = {s.name: _form_field(s, s.name) for s in settings_of(JobSpec) if s.name not in _DRAWN_BY_HAND}
    for table, model in _TABLES.items():
        fields |= {f"{table}_{s.name}": _form_field(s, f"{table}_{s.name}") for s in settings_of(model)}
    return fields


class JobLaunchForm(forms.Form):
    """The launch form: JobSpec's settings (added below the class, from JobSpec), and those drawn by hand."""

    task_name = forms.ChoiceField(label="Task", choices=(), help_text="Task adapter.")
    task_options = forms.CharField(required=False, label="Task options (JSON)", initial="{}",
                                   widget=forms.Textarea(attrs={"rows": 2}),
                                   help_text='e.g. {"max_operand": 4}')
    learner_uplink_mbps = forms.FloatField(label="B0 (learner uplink, Mbit/s)",
                                           initial=_FIELDS["learner_uplink_bps"].default * 8 / 1e6,
                                           help_text="Learner uplink; stored in bytes/s.")
    t_train_s = forms.FloatField(label="Expected T_train (s)", required=False,
                                 help_text="Seconds per learner step, for the plan only; blank: what an earlier "
                                           "job of this model and task measured, else the calibration phase.")
    t_bcast_s = forms.FloatField(label="Expected T_bcast (s)", required=False, min_value=0,
                                 help_text="Seconds per snapshot broadcast, for the plan only; blank: what an "
                                           "earlier job of this model and task measured, else 0.")
    start_now = forms.BooleanField(required=False, initial=True, label="Start right away")

    # Where the page draws each field; a JobSpec setting placed in none goes under "More settings" (see below).
    fieldsets = (
        ("Job", ("name", "model_dir", "task_name", "task_options", "start_now")),
        ("Staleness and capacity", ("staleness", "kappa", "batch_trajectories", "group_size", "gamma",
                                    "learner_uplink_mbps", "broadcast_strategy", "snapshot_dtype",
                                    "snapshot_full_every")),
        ("Training", ("learning_rate", "clip_eps", "max_steps", "budget_usd", "target_reward")),
        ("Sampling", ("max_new_tokens", "temperature", "top_p", "seed")),
        ("Prompts", tuple(f"prompt_format_{name}" for name in _TABLES["prompt_format"].model_fields)),
        ("Workers", tuple(f"requirements_{name}" for name in _TABLES["requirements"].model_fields)),
        ("Loss", tuple(LOSS_PREFIX + name for name in _LOSS)),
        ("Held-out evaluation", tuple(f"eval_{name}" for name in _TABLES["eval"].model_fields)),
        ("LoRA adapter", tuple(f"lora_{name}" for name in _TABLES["lora"].model_fields)),
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
        # Every problem at once: a field Django already refused (a blank name) does not hide the spec's errors on the
        # others; the spec is checked over what is left, and says nothing more about a field already in error.
        data = super().clean()
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
        raw["task"] = {"name": data.get("task_name", ""), **options}
        if data.get("learner_uplink_mbps") is not None:
            raw["learner_uplink_bps"] = int(data["learner_uplink_mbps"] * 1e6 / 8)
        for table, model in _TABLES.items():
            raw[table] = {name: data[f"{table}_{name}"] for name in model.model_fields
                          if data.get(f"{table}_{name}") not in blank}
        try:
            self.spec = parse_job_spec(raw)
        except JobSpecError as err:
            for name, message in err.errors:  # every one, by the form field that holds it
                table, dot, key = name.partition(".")
                field = {"task": "task_options", "learner_uplink_bps": "learner_uplink_mbps"}.get(
                    name, f"{table}_{key}" if dot and table in _TABLES else name)
                if field not in self.errors:
                    self.add_error(field if field in self.fields else None, message)
        return data

    def _post_clean(self) -> None:
        """A field in error names its message for screen readers (``aria-describedby``: the error, then its help);
        the first one in the page's order takes the focus when the page comes back."""
        super()._post_clean()
        first = True
        for _, names in self.fieldsets:
            for name in names:
                if name not in self.errors:
                    continue
                field = self.fields[name]
                described = [f"error-{name}"] + ([f"id_{name}_helptext"] if field.help_text else [])
                field.widget.attrs.update({"aria-describedby": " ".join(described), "aria-invalid": "true"})
                if first:
                    field.widget.attrs["autofocus"] = True
                    first = False



# The JobSpec settings' fields join the declared ones: a form's fields are its class's ``base_fields``.
JobLaunchForm.base_fields = {**_spec_form_fields(), **JobLaunchForm.base_fields}
JobLaunchForm.declared_fields = dict(JobLaunchForm.base_fields)
_unplaced = tuple(name for name in JobLaunchForm.base_fields
                  if all(name not in names for _, names in JobLaunchForm.fieldsets))
if _unplaced:
    JobLaunchForm.fieldsets = (*JobLaunchForm.fieldsets[:-1], ("More settings", _unplaced), JobLaunchForm.fieldsets[-1])


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
    """A job file's settings as the launch form's fields (task name and options, Mbit/s, ``<table>_*``)."""
    initial = {k: v for k, v in raw.items() if k in _FIELDS and not isinstance(v, dict) and v is not None}
    task = dict(raw["task"])
    initial["task_name"] = task.pop("name", "")
    initial["task_options"] = json.dumps(task)
    if "learner_uplink_bps" in raw:
        initial["learner_uplink_mbps"] = raw["learner_uplink_bps"] * 8 / 1e6
    for table in _TABLES:
        initial |= {f"{table}_{k}": v for k, v in (raw.get(table) or {}).items() if v is not None}
    return initial

"""DRF fields made from JobSpec's (``dataplane/jobfields.py``): the API shows, and its schema describes, every job
setting with the type, default, bounds and help JobSpec gives it, and no other copy of them exists.

The fields describe and render; they do not validate a request: ``JobSerializer`` hands the body to
``parse_job_spec`` whole (unknown keys named, every bad field at once).
"""

from __future__ import annotations

import functools

from pydantic import BaseModel
from rest_framework import serializers

from dataplane.jobfields import Setting, settings_of

_FIELD_CLASSES: dict[str, type[serializers.Field]] = {
    "int": serializers.IntegerField, "float": serializers.FloatField, "str": serializers.CharField,
    "bool": serializers.BooleanField, "json": serializers.JSONField,
}


def serializer_fields(model: type[BaseModel]) -> dict[str, serializers.Field]:
    """A new DRF field for every field of ``model``, by name, in declaration order."""
    return {setting.name: serializer_field(setting) for setting in settings_of(model)}


def serializer_field(setting: Setting) -> serializers.Field:
    kwargs: dict = {"help_text": setting.help, "allow_null": setting.nullable}
    if setting.has_default:
        kwargs["default"] = setting.default
    elif not setting.required:
        kwargs["required"] = False
    if setting.kind == "model":
        return nested_serializer(setting.model)(**kwargs)
    if setting.kind == "choice":
        return serializers.ChoiceField(choices=list(setting.choices), **kwargs)
    field_class = _FIELD_CLASSES[setting.kind]
    if setting.kind in ("int", "float"):
        kwargs |= _number_bounds(setting)
    elif setting.kind == "str":
        kwargs |= {"min_length": setting.min_length, "max_length": setting.max_length,
                   "allow_blank": not setting.min_length}
    return field_class(**kwargs)


def _number_bounds(setting: Setting) -> dict:
    """DRF's bounds are inclusive: an exclusive integer bound moves by one; an exclusive float bound is given as
    the figure itself (``learning_rate > 0`` reads ``minimum: 0``, its help says more; JobSpec refuses 0)."""
    out = {}
    for key, value, exclusive, step in (("min_value", setting.minimum, setting.exclusive_minimum, 1),
                                        ("max_value", setting.maximum, setting.exclusive_maximum, -1)):
        if value is not None:
            out[key] = int(value) + (step if exclusive else 0) if setting.kind == "int" else float(value)
    return out


@functools.cache
def nested_serializer(model: type[BaseModel]) -> type[serializers.Serializer]:
    """The serializer of a nested settings model (``JobSpec.loss``), made once so the schema names it once:
    ``LossConfig`` becomes the component ``LossConfigSettings``."""
    return type(f"{model.__name__}SettingsSerializer", (serializers.Serializer,), serializer_fields(model))

"""The job settings read off :class:`~dataplane.jobs.JobSpec` as plain facts: kind, default, bounds, help.

``JobSpec`` is the one place a job setting is written. The site does not restate it: its serializer (and so the
API schema) and its launch form turn these facts into their own kind of field (``marketplace/api/spec_fields.py``,
``frontend/forms.py``), so a field added to ``JobSpec`` shows up in both without another line.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

import annotated_types
from pydantic import BaseModel
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

Kind = Literal["int", "float", "str", "bool", "choice", "model", "json"]


@dataclass(frozen=True)
class Setting:
    """One field of a settings model as a form or a serializer needs it.

    ``minimum``/``maximum`` are inclusive, or exclusive where ``exclusive_minimum``/``exclusive_maximum`` say so
    (pydantic's ``gt``/``lt``); ``default`` is meaningful only where ``has_default``; ``model`` is the nested
    settings model of a ``model`` kind (``JobSpec.loss``: ``LossConfig``). A ``choice``'s values are read when
    asked (:attr:`choices`): a registry's names (``loss.type``) may grow after import."""

    name: str
    kind: Kind
    help: str
    required: bool
    has_default: bool
    default: Any = None
    nullable: bool = False
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    exclusive_maximum: bool = False
    min_length: int | None = None
    max_length: int | None = None
    choices_of: Callable[[], tuple[Any, ...]] = tuple
    model: type[BaseModel] | None = None

    @property
    def choices(self) -> tuple[Any, ...]:
        return self.choices_of()


def settings_of(model: type[BaseModel]) -> list[Setting]:
    """Every field of ``model``, in its declaration order."""
    return [setting(name, info) for name, info in model.model_fields.items()]


def setting(name: str, info: FieldInfo) -> Setting:
    annotation, nullable = _without_none(info.annotation)
    kind, literal, nested = _kind(annotation)
    choices_of: Callable[[], tuple[Any, ...]] = lambda: literal  # noqa: E731
    if kind == "str" and _declared_choices(info):
        kind, choices_of = "choice", lambda: _declared_choices(info)
    has_default = not info.is_required() and info.default_factory is None and info.default is not PydanticUndefined
    return Setting(name=name, kind=kind, help=info.description or "", required=info.is_required(),
                   has_default=has_default, default=info.default if has_default else None, nullable=nullable,
                   choices_of=choices_of, model=nested, **_bounds(info.metadata))


def _without_none(annotation: Any) -> tuple[Any, bool]:
    """``X | None`` as ``(X, True)``; anything else as ``(annotation, False)``."""
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        args = [arg for arg in typing.get_args(annotation) if arg is not type(None)]
        if len(args) < len(typing.get_args(annotation)):
            return (args[0] if len(args) == 1 else typing.Union[tuple(args)]), True  # noqa: UP007
    return annotation, False


def _kind(annotation: Any) -> tuple[Kind, tuple[Any, ...], type[BaseModel] | None]:
    if typing.get_origin(annotation) is Literal:
        return "choice", typing.get_args(annotation), None
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "model", (), annotation
    simple: dict[Any, Kind] = {bool: "bool", int: "int", float: "float", str: "str"}
    return simple.get(annotation, "json"), (), None


def _declared_choices(info: FieldInfo) -> tuple[Any, ...]:
    """The values a text field declares in its JSON schema (``enum``): a registry's names (``loss.type``)."""
    extra = info.json_schema_extra
    schema: dict[str, Any] = {}
    if callable(extra):
        extra(schema)  # type: ignore[call-arg]
    elif extra:
        schema = dict(extra)
    return tuple(schema.get("enum") or ())


def _bounds(metadata: list[Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for item in metadata:
        if isinstance(item, annotated_types.Ge):
            out["minimum"] = item.ge
        elif isinstance(item, annotated_types.Gt):
            out |= {"minimum": item.gt, "exclusive_minimum": True}
        elif isinstance(item, annotated_types.Le):
            out["maximum"] = item.le
        elif isinstance(item, annotated_types.Lt):
            out |= {"maximum": item.lt, "exclusive_maximum": True}
        elif isinstance(item, annotated_types.MinLen):
            out["min_length"] = item.min_length
        elif isinstance(item, annotated_types.MaxLen):
            out["max_length"] = item.max_length
    return out

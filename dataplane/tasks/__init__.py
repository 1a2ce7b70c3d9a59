"""Task adapter registry: built-ins plus any installed under the ``echo2.tasks`` entry-point group.

A third-party package adds a task without touching this code::

    [project.entry-points."echo2.tasks"]
    mytask = "mypkg.tasks:MyTask"

and a job selects it with ``{"name": "mytask", ...options}``.

A built-in task is one module of this folder whose adapter class is decorated with ``@register_task``: importing
the package imports every module here but the shared ones (:data:`SHARED`), so adding a task is that file alone
(docs/architecture.md, "How to extend"; docs/tasks.md).
"""

from __future__ import annotations

import importlib
import pkgutil
from importlib.metadata import entry_points
from typing import Any

from .base import TASKS, Prompt, TaskAdapter, TaskSpecError, register_task

SHARED = ("base", "episodes", "files")  # the modules of this folder that hold no task

for _module in pkgutil.iter_modules(__path__):
    if _module.name not in SHARED:
        importlib.import_module(f"{__name__}.{_module.name}")

BUILTIN: dict[str, type[TaskAdapter]] = dict(TASKS)  # what this package registered (tests may register more)

__all__ = ["Prompt", "TaskAdapter", "TaskSpecError", "available_tasks", "build_task", "register_task"]


def available_tasks() -> dict[str, type[TaskAdapter]]:
    """Every task a job may name: the registered ones, then those of installed packages' entry points."""
    tasks = dict(TASKS)
    for ep in entry_points(group="echo2.tasks"):
        tasks.setdefault(ep.name, ep.load())
    return tasks


def build_task(spec: dict[str, Any] | None) -> TaskAdapter:
    """Build an adapter from ``{"name": ..., **options}``; raise TaskSpecError naming the problem."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise TaskSpecError("task: expected an object with a 'name', e.g. {\"name\": \"arithmetic\"}")
    options = {k: v for k, v in spec.items() if k != "name"}
    tasks = available_tasks()
    cls = tasks.get(spec["name"])
    if cls is None:
        raise TaskSpecError(f"task: unknown task {spec['name']!r}; available: {', '.join(sorted(tasks))}")
    try:
        return cls(**options)
    except TypeError as err:
        raise TaskSpecError(f"task: {err}") from None

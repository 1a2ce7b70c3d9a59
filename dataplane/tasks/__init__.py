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

import difflib
import functools
import inspect
from importlib.metadata import entry_points
from typing import Any

from ..registry import import_modules
from .base import TASKS, Prompt, TaskAdapter, TaskSpecError, register_task

SHARED = ("base", "episodes", "files", "poker", "poker_opponents")  # modules here that hold no task (poker: an env)

import_modules(__name__, __path__, shared=SHARED)

BUILTIN: dict[str, type[TaskAdapter]] = dict(TASKS)  # what this package registered (tests may register more)

__all__ = ["Prompt", "TaskAdapter", "TaskSpecError", "available_tasks", "build_task", "register_task"]


def available_tasks() -> dict[str, type[TaskAdapter]]:
    """Every task a job may name: the registered ones, then those of installed packages' entry points."""
    tasks = dict(TASKS)
    for name, cls in _installed_tasks().items():
        tasks.setdefault(name, cls)
    return tasks


@functools.cache
def _installed_tasks() -> dict[str, type[TaskAdapter]]:
    """The ``echo2.tasks`` entry points, read once per process: finding them reads every installed distribution's
    metadata (milliseconds), and the site validates a job's settings, task included, on its sockets' hot paths. A
    package installed later is seen after a restart, as with any Python plug-in."""
    return {ep.name: ep.load() for ep in entry_points(group="echo2.tasks")}


def build_task(spec: dict[str, Any] | None) -> TaskAdapter:
    """Build an adapter from ``{"name": ..., **options}``; raise TaskSpecError naming the problem."""
    if not isinstance(spec, dict) or not isinstance(spec.get("name"), str):
        raise TaskSpecError("task: expected an object with a 'name', e.g. {\"name\": \"arithmetic\"}")
    options = {k: v for k, v in spec.items() if k != "name"}
    if "code_modules" in options:  # a job file's key, resolved where the file is read (dataplane/usercode.py)
        raise TaskSpecError("task: code_modules: the modules are packed where the job file is read (echo2 job submit "
                            "uploads the package); a job names the package by its digest, task.code")
    tasks = available_tasks()
    cls = tasks.get(spec["name"])
    if cls is None:
        raise TaskSpecError(f"task: unknown task {spec['name']!r}; available: {', '.join(sorted(tasks))}")
    unknown = _unknown_options(cls, options)
    if unknown:
        raise TaskSpecError(f"task: {spec['name']}: {unknown}")
    try:
        return cls(**options)
    except TypeError as err:
        raise TaskSpecError(f"task: {spec['name']}: {err}") from None


def _unknown_options(cls: type[TaskAdapter], options: dict[str, Any]) -> str | None:
    """The misspelt options of a task, each with the nearest one it takes, on one line (None when all are known,
    or when the adapter takes ``**kwargs``, so only it can tell)."""
    params = inspect.signature(cls).parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return None
    known = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    wrong = [name for name in options if name not in known]
    if not wrong:
        return None
    parts = []
    for name in wrong:
        near = difflib.get_close_matches(name, known, n=1)
        parts.append(f"unknown option {name!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    return "; ".join(parts) + f"; its options: {', '.join(known) or 'none'}"

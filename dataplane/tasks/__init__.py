"""Task adapter registry: built-ins plus any installed under the ``echo2.tasks`` entry-point group.

A third-party package adds a task without touching this code::

    [project.entry-points."echo2.tasks"]
    mytask = "mypkg.tasks:MyTask"

and a job selects it with ``{"name": "mytask", ...options}``.
"""

from __future__ import annotations

from importlib.metadata import entry_points
from typing import Any

from .arithmetic import ArithmeticTask
from .base import Prompt, TaskAdapter, TaskSpecError
from .countdown import CountdownTask
from .mathqa import MathTask
from .sandbox import SandboxTask

BUILTIN: dict[str, type[TaskAdapter]] = {
    task.name: task for task in (ArithmeticTask, MathTask, CountdownTask, SandboxTask)
}

__all__ = ["Prompt", "TaskAdapter", "TaskSpecError", "available_tasks", "build_task"]


def available_tasks() -> dict[str, type[TaskAdapter]]:
    tasks = dict(BUILTIN)
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

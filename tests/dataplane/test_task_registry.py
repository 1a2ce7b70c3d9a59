"""The task registry: every module of dataplane/tasks/ but the shared ones is one registered task a job can name."""

from __future__ import annotations

import pkgutil

import pytest

import dataplane.tasks
from dataplane.tasks import BUILTIN, SHARED, TaskAdapter, available_tasks, register_task


def test_every_task_module_of_the_folder_registers_its_adapter() -> None:
    modules = {m.name for m in pkgutil.iter_modules(dataplane.tasks.__path__)} - set(SHARED)

    assert {cls.__module__.rpartition(".")[2] for cls in BUILTIN.values()} == modules
    ours = {"arithmetic", "math", "countdown", "sandbox", "reasoning_gym", "verifiers"}
    assert ours <= set(BUILTIN) <= set(available_tasks())
    assert [name for name, cls in BUILTIN.items() if cls.multi_turn] == ["sandbox"]


def test_two_tasks_cannot_take_one_name() -> None:
    class Impostor(TaskAdapter):
        name = "arithmetic"

        def sample_prompts(self, rng, count):
            return []

        def reward(self, prompt, completion):
            return 0.0

    with pytest.raises(ValueError, match="'arithmetic' is already registered"):
        register_task(Impostor)

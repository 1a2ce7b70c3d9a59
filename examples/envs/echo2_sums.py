"""A small verifiers (0.4, ``verifiers.v1``) environment for examples/jobs/verifiers.toml: sums of two digits
below ``top``, the answer mod 10, scored by the task's rubric (one ``@vf.reward``). A multi-turn environment
adds ``env_response(messages, task) -> str | None`` to the taskset (docs/tasks.md)."""

from __future__ import annotations

import verifiers.v1 as vf


class SumData(vf.TaskData):
    answer: str


class SumTask(vf.Task[SumData, vf.State, vf.TaskConfig]):
    @vf.reward
    async def correct(self, task, trace) -> float:
        return float(trace.last_reply.strip() == task.answer)


class Sums(vf.Taskset):
    def __init__(self, config: vf.TasksetConfig, *, top: int) -> None:
        super().__init__(config)
        self.top = top

    def load(self):
        for a in range(self.top + 1):
            for b in range(self.top + 1):
                yield SumTask(SumData(prompt=f"{a}+{b}=", answer=str((a + b) % 10)))


def load_environment(top: int = 4) -> Sums:
    return Sums(vf.TasksetConfig(), top=top)

"""What a multi-turn episode is made of, whatever the task: the assistant turns an engine sampled and the played
episode that becomes one record (dataplane/tasks/sandbox.py explains the conversation and its loss mask)."""

from __future__ import annotations

from dataclasses import dataclass, field

from ..records import Trajectory


@dataclass(frozen=True)
class Turn:
    """One assistant turn sampled by an engine: token ids, their behaviour log-probs, decoded text."""

    ids: list[int]
    logprobs: list[float]
    text: str


@dataclass
class Episode:
    """A played episode: what a record needs, plus the canonical chat messages."""

    prompt: str
    prompt_ids: list[int]
    messages: list[dict[str, str]]
    completion_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    text: str = ""
    reward: float = 0.0
    turns: int = 0
    done: bool = False
    info: dict = field(default_factory=dict)  # the task's own metadata for the record (Omega), beside the turns

    def record(self, *, job_id: int, lease_id: str, group_id: str, version: int) -> Trajectory:
        """A trajectory record tau = (x, y, r, v, Omega) with the turn-aware loss mask."""
        return Trajectory(job_id=job_id, lease_id=lease_id, group_id=group_id, prompt=self.prompt,
                          prompt_ids=self.prompt_ids, completion=self.text, completion_ids=self.completion_ids,
                          logprobs=self.logprobs, reward=self.reward, version=version, loss_mask=self.loss_mask,
                          metadata={"turns": self.turns, **self.info})

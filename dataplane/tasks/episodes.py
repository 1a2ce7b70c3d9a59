"""What a multi-turn episode is made of, whatever the task: the assistant turns an engine sampled and the played
episode that becomes one record (dataplane/tasks/sandbox.py explains the conversation and its loss mask)."""

from __future__ import annotations

from collections.abc import Callable
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

    def add_turn(self, turn: Turn) -> None:
        """Append an assistant turn the policy sampled: trained on (loss mask 1), its log-probs kept."""
        self.completion_ids += turn.ids
        self.logprobs += turn.logprobs
        self.loss_mask += [1] * len(turn.ids)
        self.text += turn.text
        self.turns += 1
        self.messages.append({"role": "assistant", "content": turn.text})

    def add_reply(self, ids: list[int], text: str, content: str, *,
                  messages: list[dict[str, str]] | None = None) -> None:
        """Append the environment's reply: in the context, never trained on (loss mask 0, log-prob 0). It is one user
        message of ``content``, or the ``messages`` given (a tool's result and a user's, roles kept)."""
        self.completion_ids += ids
        self.logprobs += [0.0] * len(ids)
        self.loss_mask += [0] * len(ids)
        self.text += text
        self.messages += [dict(m) for m in messages] if messages else [{"role": "user", "content": content}]

    def record(self, *, job_id: int, lease_id: str, group_id: str, version: int) -> Trajectory:
        """A trajectory record tau = (x, y, r, v, Omega) with the turn-aware loss mask."""
        return Trajectory(job_id=job_id, lease_id=lease_id, group_id=group_id, prompt=self.prompt,
                          prompt_ids=self.prompt_ids, completion=self.text, completion_ids=self.completion_ids,
                          logprobs=self.logprobs, reward=self.reward, version=version, loss_mask=self.loss_mask,
                          metadata={"turns": self.turns, **self.info})


@dataclass(frozen=True)
class Reply:
    """The environment's answer to a turn when its tokens and its text differ (a chat turn's special tokens are in
    the tokens, not in their decoded text) or it is more than one user message: ``raw`` is encoded, ``text`` goes
    into the transcript, ``messages`` into the conversation."""

    raw: str
    text: str
    messages: list[dict[str, str]]


React = Callable[[int, Episode, Turn], "tuple[str, str] | Reply | None"]


def play_lockstep(episodes: list[Episode], *, max_turns: int, generate: Callable[[list[list[int]]], list[Turn]],
                  encode: Callable[[str], list[int]], react: React) -> list[Episode]:
    """The multi-turn loop of every environment task: all live episodes in lockstep, one ``generate`` call per turn.

    Each sampled turn is appended (loss mask 1); then ``react(i, episode, turn)`` is the environment's answer to
    episode ``i``: ``(text, content)``, the text appended to the transcript (encoded, loss mask 0, log-prob 0) and
    the user message's content, or a :class:`Reply`, or None, which ends the episode. An episode already ``done`` is
    not played."""
    for _ in range(max_turns):
        live = [i for i, ep in enumerate(episodes) if not ep.done]
        if not live:
            break
        turns = generate([episodes[i].prompt_ids + episodes[i].completion_ids for i in live])
        for i, turn in zip(live, turns, strict=True):
            ep = episodes[i]
            ep.add_turn(turn)
            reply = react(i, ep, turn)
            ep.done = reply is None
            if isinstance(reply, Reply):
                ep.add_reply(encode(reply.raw), reply.text, "", messages=reply.messages)
            elif reply is not None:
                text, content = reply
                ep.add_reply(encode(text), text, content)
    return episodes

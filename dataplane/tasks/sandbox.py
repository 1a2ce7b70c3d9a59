"""Multi-turn sandbox tasks: a game environment played over several assistant turns (paper appendix F.2-F.5).

One episode is a conversation (F.4)::

    [system, user(initial state), assistant(move 1), user(reply 1), ..., assistant(move T)]

The prompt ``x`` is the system and first user message rendered as text; the completion ``y`` is
everything after it: the assistant turns and the environment's replies, concatenated as token ids.
Only assistant tokens learn (F.5.1): the record's ``loss_mask`` is 1 on assistant tokens and 0 on the
environment's; environment tokens carry log-prob 0 (they were not sampled, and are masked anyway).
The reward is the episodic return ``R = sum_t r_t`` (F.5.2); group normalization happens in the learner.

How an engine drives the turns -- :func:`run_episodes` does it, given two callables:

- ``generate(contexts)``: for each context (token ids: the prompt plus every turn so far) sample one
  assistant turn and return a :class:`Turn` (its token ids, their behaviour log-probs, its text).
  Engines should stop a turn at its first ``</answer>`` (a stop string) or at the end-of-turn token.
- ``encode(text)``: token ids of an environment reply, without special tokens.

It reads each turn's action from its first ``<answer>...</answer>``, steps the environment, appends the
reply's tokens (mask 0) and asks for the next turn, until the game ends or ``max_turns`` is reached.
A turn without a legal action forfeits the episode. The result carries everything a record needs
(:meth:`Episode.record`). ``reward(prompt, completion)`` replays the same game from the completion text
alone, so a record's reward can be re-checked anywhere; it agrees with the live return whenever each
turn stops at its first ``</answer>``.

Environments are deterministic and rebuilt from the prompt text alone (a worker knows nothing else).
Switching game is configuration: ``{"name": "sandbox", "env": "nim", ...options}``.
"""

from __future__ import annotations

import importlib
import random
import re
from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task
from .episodes import Episode, Turn, play_lockstep

#: The most tokens of one environment reply in a completion (a one-line message).
REPLY_TOKENS = 256
SYSTEM = "You play a turn-based game. Give each move as <answer>move</answer>."
# No newline inside an action: environment replies start with one, so an action never spans a reply.
_ACTION = re.compile(r"<answer>([^<\n]*)</answer>")


def parse_action(text: str, start: int = 0) -> re.Match[str] | None:
    """The first ``<answer>...</answer>`` of an assistant turn (at or after ``start``)."""
    return _ACTION.search(text, start)


def render_reply(observation: str) -> str:
    """An environment reply as it appears in the completion text (and is tokenized)."""
    return f"\n{observation}\n"


@dataclass(frozen=True)
class Step:
    """The environment's answer to one action: its reply (a user message), the reward r_t, and whether it ended."""

    observation: str
    reward: float
    done: bool


class GameState(ABC):
    """One episode in progress."""

    @abstractmethod
    def step(self, action: str | None) -> Step:
        """Apply the agent's action (None when the turn had none); illegal actions end the episode."""


class Game(ABC):
    """A deterministic game: its options, how to draw a start, and how to rebuild a start from its text."""

    name: str = ""
    #: Characters of its messages (for tiny tokenizers).
    alphabet: str = ""
    #: The episodic returns ``sum_t r_t`` the game can give, ``(low, high)``: the task's reward range.
    return_range: tuple[float, float] = (0.0, 1.0)

    @abstractmethod
    def sample_start(self, rng: random.Random) -> str:
        """The first user message: the serialized initial state and the rules."""

    @abstractmethod
    def start(self, first_message: str) -> GameState | None:
        """The state described by ``first_message``; None when it is not a start this game could have drawn."""

    @abstractmethod
    def options(self) -> dict[str, Any]:
        """The options that rebuild this game."""


class Nim(Game):
    """Single-pile Nim against an optimal opponent: take 1..max_take stones, taking the last stone wins.

    Starts are drawn so that the first player (the agent) can always win: ``stones % (max_take+1) != 0``.
    Winning needs perfect play -- leaving a multiple of ``max_take+1`` after every move. Return: 1 win, 0 else.
    """

    name = "nim"
    return_range = (0.0, 1.0)
    _START = re.compile(r"^There are (\d+) stones\. Each turn a player takes 1 to (\d+) stones; taking the last "
                        r"stone wins\. You move first\.$")
    alphabet = "".join(sorted(set(
        "There are stones. Each turn a player takes 1 to stones; taking the last stone wins. You move first."
        "I took . stones left. Your move.0123456789")))

    def __init__(self, *, max_stones: int = 15, max_take: int = 3) -> None:
        if not isinstance(max_take, int) or isinstance(max_take, bool) or not 1 <= max_take <= 9:
            raise TaskSpecError("max_take: must be an integer between 1 and 9")
        if not isinstance(max_stones, int) or isinstance(max_stones, bool) or not max_take + 2 <= max_stones <= 1000:
            raise TaskSpecError(f"max_stones: must be an integer between max_take+2 ({max_take + 2}) and 1000")
        self.max_stones, self.max_take = max_stones, max_take

    def options(self) -> dict[str, Any]:
        return {"max_stones": self.max_stones, "max_take": self.max_take}

    def describe(self, stones: int) -> str:
        return (f"There are {stones} stones. Each turn a player takes 1 to {self.max_take} stones; taking the last "
                "stone wins. You move first.")

    def sample_start(self, rng: random.Random) -> str:
        winning = [s for s in range(2, self.max_stones + 1) if s % (self.max_take + 1)]
        return self.describe(rng.choice(winning))

    def start(self, first_message: str) -> NimState | None:
        match = self._START.match(first_message)
        if match is None or int(match[2]) != self.max_take or not 1 <= int(match[1]) <= self.max_stones:
            return None
        return NimState(stones=int(match[1]), max_take=self.max_take)


@dataclass
class NimState(GameState):
    stones: int
    max_take: int

    def step(self, action: str | None) -> Step:
        text = (action or "").strip()
        if not text.isdigit() or not 1 <= int(text) <= min(self.max_take, self.stones):
            return Step(observation="", reward=0.0, done=True)  # forfeit
        self.stones -= int(text)
        if self.stones == 0:
            return Step(observation="", reward=1.0, done=True)
        take = min(self.stones % (self.max_take + 1) or 1, self.stones)  # optimal, else the smallest move
        self.stones -= take
        if self.stones == 0:
            return Step(observation="", reward=0.0, done=True)
        return Step(observation=f"I took {take}. {self.stones} stones left. Your move.", reward=0.0, done=False)


GAMES: dict[str, type[Game]] = {Nim.name: Nim}
#: Environments in modules of their own, imported when a job names one (their package may be an extra).
MODULE_GAMES = {"poker": "poker:PokerGame"}


def game_class(env: str) -> type[Game] | None:
    if env in MODULE_GAMES and env not in GAMES:
        module, _, cls = MODULE_GAMES[env].partition(":")
        GAMES[env] = getattr(importlib.import_module(f".{module}", __package__), cls)
    return GAMES.get(env)


@register_task
class SandboxTask(TaskAdapter):
    name = "sandbox"
    multi_turn = True

    def __init__(self, *, env: str = "nim", max_turns: int = 10, **options: Any) -> None:
        if not isinstance(env, str) or game_class(env) is None:
            raise TaskSpecError(f"env: unknown environment {env!r}; available: "
                                f"{', '.join(sorted({*GAMES, *MODULE_GAMES}))}")
        if not isinstance(max_turns, int) or isinstance(max_turns, bool) or not 1 <= max_turns <= 100:
            raise TaskSpecError("max_turns: must be an integer between 1 and 100")
        try:
            self.game = GAMES[env](**options)
        except TypeError as err:
            raise TaskSpecError(f"{env}: {err}") from None
        self.env, self.max_turns = env, max_turns
        self.reward_range = self.game.return_range
        self.alphabet = "".join(sorted(set(SYSTEM + self.game.alphabet + "<answer>/\n")))

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "env": self.env, "max_turns": self.max_turns, **self.game.options()}

    def max_completion_tokens(self, max_new_tokens: int) -> int:
        """Every turn's sampled tokens plus the environment's reply after it (a short line: at most
        :data:`REPLY_TOKENS` tokens even at one token per byte); a game that plays its own episodes says."""
        if hasattr(self.game, "max_completion_tokens"):
            return self.game.max_completion_tokens(self.max_turns, max_new_tokens)
        return self.max_turns * (max_new_tokens + REPLY_TOKENS)

    def first_messages(self, first_user: str) -> list[dict[str, str]]:
        return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": first_user}]

    def render_prompt(self, messages: list[dict[str, str]]) -> str:
        return "".join(f"{m['content']}\n" for m in messages)

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        return [Prompt(text=self.render_prompt(self.first_messages(self.game.sample_start(rng))))
                for _ in range(count)]

    def start(self, prompt: str) -> GameState | None:
        """The initial state of ``prompt``'s game; None for a prompt this task could not have produced."""
        head = f"{SYSTEM}\n"
        if not prompt.startswith(head) or not prompt.endswith("\n"):
            return None
        return self.game.start(prompt[len(head):-1])

    def play(self, prompts: list[str], *, generate: Callable[[list[list[int]]], list[Turn]],
             encode: Callable[[str], list[int]], prompt_ids: list[list[int]] | None = None) -> list[Episode]:
        if hasattr(self.game, "play"):  # a game with its own loop (poker: a self-play opponent samples too)
            return self.game.play(self, prompts, generate=generate, encode=encode, prompt_ids=prompt_ids)
        return run_episodes(self, prompts, generate=generate, encode=encode, prompt_ids=prompt_ids)

    def reward(self, prompt: str, completion: str) -> float:
        """Replay the episode from its transcript: each turn's first action, then the reply that must follow it."""
        if hasattr(self.game, "replay"):
            return self.game.replay(self, prompt, completion)
        state = self.start(prompt)
        if state is None:
            return 0.0
        total, pos = 0.0, 0
        for _ in range(self.max_turns):
            action = parse_action(completion, pos)
            result = state.step(action[1] if action else None)
            total += result.reward
            if result.done or action is None:
                return total
            reply = completion.find(render_reply(result.observation), action.end())
            if reply < 0:  # the transcript ends before the environment answered (e.g. a single-turn engine)
                return total
            pos = reply + len(render_reply(result.observation))
        return total


def run_episodes(task: SandboxTask, prompts: list[str], *, generate: Callable[[list[list[int]]], list[Turn]],
                 encode: Callable[[str], list[int]], prompt_ids: list[list[int]] | None = None) -> list[Episode]:
    """Play one episode per prompt, all in lockstep: one ``generate`` call per turn for the live episodes.

    ``prompt_ids`` defaults to ``encode(prompt)``; pass the engine's own prompt encoding (with BOS) instead.
    A prompt the task cannot parse gives an episode with no turns and reward 0 (it is not played).
    """
    ids = prompt_ids if prompt_ids is not None else [encode(p) for p in prompts]
    episodes, states = [], []
    for prompt, pids in zip(prompts, ids, strict=True):
        state = task.start(prompt)
        first_user = prompt[len(SYSTEM) + 1:-1] if state is not None else prompt
        episodes.append(Episode(prompt=prompt, prompt_ids=list(pids), messages=task.first_messages(first_user),
                                done=state is None))
        states.append(state)

    def react(i: int, ep: Episode, turn: Turn) -> tuple[str, str] | None:
        action = parse_action(turn.text)
        result = states[i].step(action[1] if action else None)
        ep.reward += result.reward
        if result.done or action is None:
            return None
        return render_reply(result.observation), result.observation

    return play_lockstep(episodes, max_turns=task.max_turns, generate=generate, encode=encode, react=react)


def run_episode(task: SandboxTask, prompt: str, *, generate: Callable[[list[int]], Turn],
                encode: Callable[[str], list[int]], prompt_ids: list[int] | None = None) -> Episode:
    """One episode; ``generate(context_ids)`` samples one assistant turn. See :func:`run_episodes`."""
    return run_episodes(task, [prompt], generate=lambda contexts: [generate(c) for c in contexts], encode=encode,
                        prompt_ids=None if prompt_ids is None else [prompt_ids])[0]

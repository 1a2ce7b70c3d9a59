"""``dataset``: prompts from the owner's data set, scored by reward functions in TRL's shape (docs/datasets.md).

The spec names the data set by content, never by path::

    {"name": "dataset",
     "data": {"digest": "<sha256>", "format": "parquet", "prompt_column": "question", "answer_column": "answer",
              "columns": ["level"], "filter": {"column": "level", "op": "<=", "value": 3}, "shuffle": true},
     "reward": ["math_verify", {"function": "format", "weight": 0.2}]}

The site builds this task to validate a job and never reads the rows. The learner and each agent read them, once,
from where their machine holds the digest (:func:`dataplane.dataset.content.locate`: the learner's ``--dataset``
or its copy of an upload, the agent's cache entry fetched from the learner), when the task is prepared or first
asked for a prompt or a reward. As with ``math``, a worker knows only the prompt's text, so the task keeps an index
from prompt text to its row (the columns passed to the reward functions), built alike on every machine from the
same content. A prompt not in the data set scores 0.

A row's prompt is a text (TRL's "standard" format) or a list of ``{"role", "content"}`` messages ("conversational":
it travels as :func:`dataplane.chat.encode_chat`'s text and a chat job renders it with the chat template, the
system turn kept). The workers score the functions a spec runs on them (:meth:`DatasetTask.reward`: the built-ins);
the learner scores the owner's functions (:meth:`DatasetTask.owner_scores`, learner/scoring.py) with TRL's whole
signature: ``prompts``, ``completions`` (messages for a chat job), ``completion_ids``, ``trainer_state`` and every
column.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from ..chat import Message, PromptFormat, chat_messages, decode_chat, encode_chat
from ..dataset.content import DatasetError, locate
from ..dataset.load import INSTALL_HINT, load_rows
from ..dataset.spec import DataSpec, parse_data
from ..records import MAX_REWARD
from ..rewards import CannotServe, Reward, RewardError, RewardSpec, RewardStats, build_reward, parse_reward_spec
from ..usercode import CodeError, activate, deactivate, parse_code
from .base import Prompt, TaskAdapter, TaskSpecError, register_task

MAX_PROMPT_CHARS = 100_000


class DatasetsMissing(CannotServe):
    """This machine cannot read data sets (no Hugging Face ``datasets``): a worker refuses the job, once."""


def prompt_of(value: Any) -> str | None:
    """A row's prompt as it travels: a text as it is, a list of messages as :func:`encode_chat`'s text; None for
    anything else."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and value and all(isinstance(m, dict) and isinstance(m.get("role"), str)
                                                 and isinstance(m.get("content"), str) for m in value):
        return encode_chat(value)
    return None


def index_rows(rows: list[dict[str, Any]], data: DataSpec) -> dict[str, dict[str, Any]]:
    """Prompt text -> the columns passed to the reward functions. A prompt listed twice with different columns is
    refused (a worker could not tell which row it scores); listed twice alike, it is one prompt."""
    index: dict[str, dict[str, Any]] = {}
    passed = data.passed_columns(list(rows[0]) if rows else [])
    for number, row in enumerate(rows):
        prompt = prompt_of(row.get(data.prompt_column))
        if not prompt or len(prompt) > MAX_PROMPT_CHARS:
            raise DatasetError(f"data.prompt_column: row {number}: {data.prompt_column!r} is neither a text nor a "
                               f"list of {{role, content}} messages of 1..{MAX_PROMPT_CHARS} characters "
                               f"({type(row.get(data.prompt_column)).__name__})")
        columns = {name: row.get(name) for name in passed}
        if index.setdefault(prompt, columns) != columns:
            raise DatasetError(f"data.prompt_column: row {number}: the prompt {prompt[:60]!r} is in the data set "
                               "twice with different columns; a worker scores by prompt text alone")
    if not index:
        raise DatasetError("data.filter: no row of the data set is left to train on")
    return index


@register_task
class DatasetTask(TaskAdapter):
    name = "dataset"

    def __init__(self, *, data: Any = None, reward: Any = None, code: Any = None) -> None:
        try:
            self.data = parse_data(data)
            self.code = parse_code(code)
        except ValueError as err:
            raise TaskSpecError(str(err)) from None
        if reward is None:
            raise TaskSpecError("reward: required: a built-in scorer (\"exact_match\", \"math_verify\"), a function "
                                "\"pkg.module:fn\" or a weighted list of them (docs/rewards.md)")
        try:
            self.reward_spec: RewardSpec = parse_reward_spec(reward)
        except RewardError as err:
            raise TaskSpecError(str(err)) from None
        bounds = self.reward_spec.bounds()
        self.reward_range = bounds if bounds is not None else (-MAX_REWARD, MAX_REWARD)
        self._lock = threading.Lock()
        self._index: dict[str, dict[str, Any]] | None = None
        self._prompts: list[str] = []
        self._order: list[int] = []
        self._reward: Reward | None = None  # the functions the workers score
        self._owner: Reward | None = None  # the functions the learner scores

    @property
    def alphabet(self) -> str:  # type: ignore[override]  # the base class's is a constant; this one is read
        """The characters of the prompts and answers (for tiny char tokenizers), when this machine holds the rows."""
        if locate(self.data.digest) is None:
            return ""
        answers = [str(value) for row in self._rows().values() for value in row.values() if isinstance(value, str)]
        return "".join(sorted(set("".join(self._prompts) + "".join(answers))))

    def spec(self) -> dict[str, Any]:
        code = {"code": self.code} if self.code else {}
        return {"name": self.name, "data": self.data.model_dump(mode="json"),
                "reward": self.reward_spec.model_dump(mode="json"), **code}

    def content_digests(self) -> list[str]:
        return [self.data.digest, *super().content_digests()]

    def user_code(self) -> list[str]:
        return self.reward_spec.worker_user_functions

    def learner_scored(self) -> list[str]:
        return [f.function for f in self.reward_spec.functions if f.on_learner]

    def prepare(self, *, allow_user_code: bool) -> None:
        """Build the reward (user functions only with ``allow_user_code``) and, when this machine holds the data set
        already, read the rows (else they are read when first needed: an agent fetches the data set with the
        job's base)."""
        try:
            import datasets  # noqa: F401 - only whether it is there
        except ImportError:
            raise DatasetsMissing(f"data: reading data sets needs Hugging Face datasets: {INSTALL_HINT}") from None
        workers = self.reward_spec.part(learner=False)
        if allow_user_code and self.reward_spec.worker_user_functions:
            try:  # the owner's functions scored here import from the job's code package, where this machine holds
                if self.code:  # it; never from an earlier job's
                    activate(self.code)
                else:
                    deactivate()
            except CodeError as err:
                raise TaskSpecError(str(err)) from None
        self._reward = build_reward(workers, allow_user_code=allow_user_code) if workers is not None else None
        if locate(self.data.digest) is not None:
            self._rows()

    def reward_stats(self):  # noqa: ANN201 - RewardStats | None, as the base class says
        return self._reward.stats if self._reward is not None else None

    def _rows(self) -> dict[str, dict[str, Any]]:
        with self._lock:
            if self._index is None:
                path = locate(self.data.digest)
                if path is None:
                    raise DatasetError(f"data.digest: this machine holds no copy of data set {self.data.digest[:12]}"
                                       "...: the learner serves it to the job's workers; a learner reads it from "
                                       "--dataset PATH or the site's upload")
                self._index = index_rows(load_rows(path, self.data), self.data)
                self._prompts = list(self._index)
            return self._index

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        """The next ``count`` prompts in the data set's order, or in an order shuffled with ``rng`` (seeded with the
        job's seed), a fresh one each pass."""
        self._rows()
        out: list[Prompt] = []
        with self._lock:
            while len(out) < count:
                if not self._order:
                    self._order = list(range(len(self._prompts)))
                    if self.data.shuffle:
                        random.Random(rng.getrandbits(64)).shuffle(self._order)
                    self._order.reverse()  # popped from the end: the order above
                out.append(Prompt(self._prompts[self._order.pop()]))
        return out

    def reward(self, prompt: str, completion: str) -> float:
        """The workers' part of the reward: the functions they score (0 when the learner scores them all)."""
        workers = self.reward_spec.part(learner=False)
        row = self._rows().get(prompt) if workers is not None else None
        if row is None:
            return 0.0
        if self._reward is None:  # not prepared: built-ins only
            self._reward = build_reward(workers, allow_user_code=False)
        return self._reward([prompt], [completion], **{name: [value] for name, value in row.items()})[0]

    def owner_scores(self, prompts: list[str], completions: list[str], *, completion_ids: list[list[int]],
                     trainer_state: Any, chat: PromptFormat | None) -> tuple[list[float], dict[str, list[float]]]:
        """The learner's part of the reward of each record (the owner's functions, TRL's whole signature), and each
        function's own scores; a prompt not in the data set scores 0. Never raises for what a function does
        (:meth:`owner_stats` counts it)."""
        owner = self.reward_spec.part(learner=True)
        if owner is None:
            return [0.0] * len(completions), {}
        if self._owner is None:
            self._owner = build_reward(owner, allow_user_code=True)
        rows = self._rows()
        known = [i for i, p in enumerate(prompts) if p in rows]
        totals, each = [0.0] * len(prompts), {f.function: [0.0] * len(prompts) for f in owner.functions}
        if not known:
            return totals, each
        names = list(rows[prompts[known[0]]])
        columns = {name: [rows[prompts[i]].get(name) for i in known] for name in names}
        got, scores = self._owner.each([as_trl_prompt(prompts[i], chat) for i in known],
                                       [as_trl_completion(completions[i], chat) for i in known],
                                       shared={"trainer_state": trainer_state},
                                       completion_ids=[completion_ids[i] for i in known], **columns)
        for k, i in enumerate(known):
            totals[i] = got[k]
            for name, values in scores.items():
                each[name][i] = values[k]
        return totals, each

    def owner_preflight(self, count: int, *, chat: PromptFormat | None, trainer_state: Any = None) -> str:
        """Every owner function called on the data set's first ``count`` rows (each completed by its answer column,
        or empty), before any training: "" when each returned numbers, else the failure with its traceback."""
        owner = self.reward_spec.part(learner=True)
        if owner is None:
            return ""
        try:
            reward = build_reward(owner, allow_user_code=True)
        except RewardError as err:
            return str(err)
        rows = self._rows()
        prompts = self._prompts[:count]
        names = list(rows[prompts[0]])
        answers = [str(rows[p].get(self.data.answer_column or "answer") or "") for p in prompts]
        return reward.check([as_trl_prompt(p, chat) for p in prompts], [as_trl_completion(a, chat) for a in answers],
                            shared={"trainer_state": trainer_state}, completion_ids=[[] for _ in prompts],
                            **{name: [rows[p].get(name) for p in prompts] for name in names})

    def owner_stats(self) -> RewardStats | None:
        """What the owner's functions did wrong on this machine so far (None: not scored here yet)."""
        return self._owner.stats if self._owner is not None else None


def as_trl_prompt(prompt: str, chat: PromptFormat | None) -> str | list[Message]:
    """A prompt as TRL passes it to reward functions: the text, or for a chat job (or a conversational row) the
    messages, the job's system message first."""
    if chat is None or not chat.chat:
        return decode_chat(prompt) or prompt
    return chat_messages(prompt, chat)


def as_trl_completion(completion: str, chat: PromptFormat | None) -> str | list[Message]:
    """A completion as TRL passes it: the text, or for a chat job ``[{"role": "assistant", "content": text}]``."""
    return [{"role": "assistant", "content": completion}] if chat is not None and chat.chat else completion

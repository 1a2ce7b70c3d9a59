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
from prompt text to its row (the answer and the columns passed to the reward functions), built alike on every
machine from the same content. A prompt not in the data set scores 0.
"""

from __future__ import annotations

import random
import threading
from typing import Any

from ..dataset.content import DatasetError, locate
from ..dataset.load import INSTALL_HINT, load_rows
from ..dataset.spec import DataSpec, parse_data
from ..records import MAX_REWARD
from ..rewards import CannotServe, Reward, RewardError, RewardSpec, build_reward, parse_reward_spec
from .base import Prompt, TaskAdapter, TaskSpecError, register_task

MAX_PROMPT_CHARS = 100_000


class DatasetsMissing(CannotServe):
    """This machine cannot read data sets (no Hugging Face ``datasets``): a worker refuses the job, once."""


def index_rows(rows: list[dict[str, Any]], data: DataSpec) -> dict[str, dict[str, Any]]:
    """Prompt text -> the columns passed to the reward functions. A prompt listed twice with different columns is
    refused (a worker could not tell which row it scores); listed twice alike, it is one prompt."""
    index: dict[str, dict[str, Any]] = {}
    passed = data.passed_columns()
    for number, row in enumerate(rows):
        prompt = row.get(data.prompt_column)
        if not isinstance(prompt, str) or not prompt or len(prompt) > MAX_PROMPT_CHARS:
            raise DatasetError(f"data.prompt_column: row {number}: {data.prompt_column!r} is not a text of 1.."
                               f"{MAX_PROMPT_CHARS} characters ({type(prompt).__name__})")
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

    def __init__(self, *, data: Any = None, reward: Any = None) -> None:
        try:
            self.data = parse_data(data)
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
        self._reward: Reward | None = None

    @property
    def alphabet(self) -> str:  # type: ignore[override]  # the base class's is a constant; this one is read
        """The characters of the prompts and answers (for tiny char tokenizers), when this machine holds the rows."""
        if locate(self.data.digest) is None:
            return ""
        answers = [str(row.get(self.data.answer_column, "")) for row in self._rows().values()]
        return "".join(sorted(set("".join(self._prompts) + "".join(answers))))

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "data": self.data.model_dump(mode="json"),
                "reward": self.reward_spec.model_dump(mode="json")}

    def content_digests(self) -> list[str]:
        return [self.data.digest]

    def user_code(self) -> list[str]:
        return self.reward_spec.user_functions

    def prepare(self, *, allow_user_code: bool) -> None:
        """Build the reward (user functions only with ``allow_user_code``) and, when this machine holds the data set
        already, read the rows (else they are read when first needed: an agent fetches the data set with the
        job's base)."""
        try:
            import datasets  # noqa: F401 - only whether it is there
        except ImportError:
            raise DatasetsMissing(f"data: reading data sets needs Hugging Face datasets: {INSTALL_HINT}") from None
        self._reward = build_reward(self.reward_spec, allow_user_code=allow_user_code)
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
        row = self._rows().get(prompt)
        if row is None:
            return 0.0
        if self._reward is None:  # not prepared: built-ins only
            self._reward = build_reward(self.reward_spec, allow_user_code=False)
        return self._reward([prompt], [completion], **{name: [value] for name, value in row.items()})[0]

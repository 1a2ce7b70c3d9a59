"""The reward part of a task spec: which functions score a completion, with which weights and options.

A job names its reward in the task spec as ``"reward"``, in any of three shapes, all normalized to the last::

    "math_verify"                                   # one function, weight 1
    ["math_verify", {"function": "format", "weight": 0.2, "options": {"pattern": "<answer>.*</answer>"}}]
    {"functions": [{"function": "mypkg.rewards:correct", "weight": 1.0, "fallback": 0.0}]}

A function is a built-in scorer's name (``dataplane/rewards/builtins.py``) or a user function ``"pkg.module:fn"``.
Where it runs is its ``scored_on``: a built-in on the workers (they return its score with the record), a user
function on the job's learner (the owner's machine: workers need no copy of it, cannot forge its score), unless the
spec says ``"scored_on": "worker"`` (a heavy function; it then runs only on workers whose provider opted in,
docs/rewards.md). TRL's ``reward_weights`` may be given beside the functions (``{"functions": [...], "weights":
[...]}``). Parsing a spec imports nothing, so the site validates a job's reward without running or even loading
the owner's code.
"""

from __future__ import annotations

import math
import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .builtins import SCORERS

MAX_FUNCTIONS = 16
MAX_WEIGHT = 1e3  # |weight|: a weighted sum of scores stays far inside the records' MAX_REWARD
MAX_OPTIONS_BYTES = 4096
#: ``pkg.module:fn``: a dotted module path, a colon, a dotted attribute path.
USER_FUNCTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


#: How a worker's ``failed`` state reason reads when it refuses a job rather than crashed serving it (its task runs
#: user code its provider did not allow), for people: the heartbeat's ``refused`` flag is what the site acts on.
REFUSED = "refuses the job: "


class RewardError(ValueError):
    """A reward spec that cannot be built; the message starts with the field at fault (``reward.functions.0...``)."""


class CannotServe(RewardError):
    """What the spec names cannot run on this machine, and will not until its provider changes something: a worker
    refuses the job (a heartbeat with ``refused``, its reason in words) rather than crash and retry. A task's own
    such error (a verifiers environment refused) may subclass it to be refused alike."""


class UserCodeRefused(CannotServe):
    """The spec names user code (``pkg.module:fn``) and this machine does not run it (the provider did not opt in
    with ``echo2-agent run --allow-user-code``)."""


class ScorerMissing(CannotServe):
    """A built-in scorer's package is not installed here (``math_verify``: ``pip install 'echo2[math]'``)."""


class RewardFunctionSpec(BaseModel):
    """One scoring function of a reward and its weight in the sum."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    function: str = Field(min_length=1, max_length=200, description="A built-in scorer (math_verify, exact_match, "
                          "regex, format) or a user function 'pkg.module:fn' with TRL's reward_funcs signature.")
    weight: float = Field(default=1.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT, description="Its weight in the weighted sum.")
    options: dict[str, Any] = Field(default_factory=dict, description="The function's options (a built-in's, e.g. "
                                    "a regex 'pattern'; a user function gets them as keyword arguments).")
    fallback: float = Field(default=0.0, ge=-MAX_WEIGHT, le=MAX_WEIGHT, description="The score of a record whose "
                            "function raised or returned a non-finite value.")
    factory: dict[str, Any] | None = Field(default=None, description="A user function that makes the reward "
                                           "function (TRL's get_soft_overlong_punishment): called once with these "
                                           "keyword arguments, its result scores.")
    scored_on: Literal["learner", "worker"] | None = Field(default=None, description="Where it runs: 'learner' (the "
                                                           "default for a user function: the owner's machine) or "
                                                           "'worker' (the default for a built-in; a user function "
                                                           "there needs workers run with --allow-user-code).")

    @field_validator("function")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in SCORERS and not USER_FUNCTION.fullmatch(value):
            raise ValueError(f"{value!r} is neither a built-in scorer ({', '.join(sorted(SCORERS))}) nor a user "
                             "function 'pkg.module:fn'")
        return value

    @field_validator("options", "factory")
    @classmethod
    def _small(cls, value: dict[str, Any] | None) -> dict[str, Any] | None:
        if len(repr(value)) > MAX_OPTIONS_BYTES:
            raise ValueError(f"at most {MAX_OPTIONS_BYTES} characters of options")
        return value

    @property
    def is_user_code(self) -> bool:
        """Whether this function is the owner's code rather than a built-in scorer."""
        return self.function not in SCORERS

    @property
    def on_learner(self) -> bool:
        """Whether the learner scores it (after the workers returned the completion), not the workers."""
        return self.scored_on == "learner" if self.scored_on is not None else self.is_user_code


class RewardSpec(BaseModel):
    """A reward: the weighted sum of one or several functions (``reward = sum(weight_i * f_i)``)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    functions: list[RewardFunctionSpec] = Field(min_length=1, max_length=MAX_FUNCTIONS)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, data: Any) -> Any:
        """``"name"`` and ``[...]`` stand for ``{"functions": [...]}``; a string item for ``{"function": it}``."""
        if isinstance(data, str):
            data = [data]
        if isinstance(data, list):
            data = {"functions": data}
        if isinstance(data, dict) and isinstance(data.get("functions"), list):
            data = {**data, "functions": [{"function": f} if isinstance(f, str) else f for f in data["functions"]]}
        if isinstance(data, dict) and "weights" in data:  # TRL's reward_weights: one per function, in order
            data = dict(data)
            weights = data.pop("weights")
            if not isinstance(weights, list) or not isinstance(data.get("functions"), list) \
                    or len(weights) != len(data["functions"]):
                raise ValueError("weights: one weight per function (TRL's reward_weights)")
            data["functions"] = [{**f, "weight": w} if isinstance(f, dict) else f
                                 for f, w in zip(data["functions"], weights, strict=True)]
        return data

    @property
    def user_functions(self) -> list[str]:
        """The user functions it names (empty: built-ins only)."""
        return [f.function for f in self.functions if f.is_user_code]

    @property
    def worker_user_functions(self) -> list[str]:
        """The user functions the workers run (``scored_on = "worker"``): what a provider must opt in to."""
        return [f.function for f in self.functions if f.is_user_code and not f.on_learner]

    def part(self, *, learner: bool) -> RewardSpec | None:
        """The functions the learner scores (``learner``) or the workers do; None when there are none."""
        chosen = [f for f in self.functions if f.on_learner == learner]
        return RewardSpec(functions=chosen) if chosen else None

    def bounds(self) -> tuple[float, float] | None:
        """The range of what a worker claims: the weighted sum of the functions the workers score when each is a
        built-in (in [0, 1]); (0, 0) when the learner scores every function; None with user code on the workers
        (its range is unknown)."""
        on_workers = [f for f in self.functions if not f.on_learner]
        if any(f.is_user_code for f in on_workers):
            return None
        low = math.fsum(min(f.weight, 0.0, f.weight * f.fallback) for f in on_workers)
        high = math.fsum(max(f.weight, 0.0, f.weight * f.fallback) for f in on_workers)
        return low, high


def parse_reward_spec(value: Any, *, field: str = "reward") -> RewardSpec:
    """Parse ``value`` (any shape above) into a :class:`RewardSpec`; raise :class:`RewardError` naming the field."""
    if isinstance(value, RewardSpec):
        return value
    try:
        return RewardSpec.model_validate(value)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(p) for p in (field, *first["loc"]))
        raise RewardError(f"{where}: {first['msg'].removeprefix('Value error, ')}") from None

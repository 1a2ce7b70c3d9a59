"""The reward part of a task spec: which functions score a completion, with which weights and options.

A job names its reward in the task spec as ``"reward"``, in any of three shapes, all normalized to the last::

    "math_verify"                                   # one function, weight 1
    ["math_verify", {"function": "format", "weight": 0.2, "options": {"pattern": "<answer>.*</answer>"}}]
    {"functions": [{"function": "mypkg.rewards:correct", "weight": 1.0, "fallback": 0.0}]}

A function is a built-in scorer's name (``dataplane/rewards/builtins.py``) or a user function ``"pkg.module:fn"``
(user code: it runs on a worker only where the provider opted in, docs/rewards.md). Parsing a spec imports nothing,
so the site validates a job's reward without running or even loading the owner's code.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from .builtins import SCORERS

MAX_FUNCTIONS = 16
MAX_WEIGHT = 1e3  # |weight|: a weighted sum of scores stays far inside the records' MAX_REWARD
MAX_OPTIONS_BYTES = 4096
#: ``pkg.module:fn``: a dotted module path, a colon, a dotted attribute path.
USER_FUNCTION = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")


#: How a worker's ``failed`` state reason starts when it refuses a job rather than crashed serving it (its task runs
#: user code its provider did not allow): the site releases it at once and plans it no more for that job.
REFUSED = "refuses the job: "


class RewardError(ValueError):
    """A reward spec that cannot be built; the message starts with the field at fault (``reward.functions.0...``)."""


class CannotServe(RewardError):
    """What the spec names cannot run on this machine, and will not until its provider changes something: a worker
    refuses the job (its reason starting with :data:`REFUSED`) rather than crash and retry. A task's own such error
    (a verifiers environment refused) may subclass it to be refused alike."""


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

    @field_validator("function")
    @classmethod
    def _known(cls, value: str) -> str:
        if value not in SCORERS and not USER_FUNCTION.fullmatch(value):
            raise ValueError(f"{value!r} is neither a built-in scorer ({', '.join(sorted(SCORERS))}) nor a user "
                             "function 'pkg.module:fn'")
        return value

    @field_validator("options")
    @classmethod
    def _small(cls, value: dict[str, Any]) -> dict[str, Any]:
        if len(repr(value)) > MAX_OPTIONS_BYTES:
            raise ValueError(f"at most {MAX_OPTIONS_BYTES} characters of options")
        return value

    @property
    def is_user_code(self) -> bool:
        """Whether this function is the owner's code rather than a built-in scorer."""
        return self.function not in SCORERS


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
        return data

    @property
    def user_functions(self) -> list[str]:
        """The user functions it names (empty: built-ins only)."""
        return [f.function for f in self.functions if f.is_user_code]

    def bounds(self) -> tuple[float, float] | None:
        """The range of the weighted sum when every function is a built-in (each scores in [0, 1]); None with user
        code (its range is unknown)."""
        if self.user_functions:
            return None
        low = math.fsum(min(f.weight, 0.0, f.weight * f.fallback) for f in self.functions)
        high = math.fsum(max(f.weight, 0.0, f.weight * f.fallback) for f in self.functions)
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

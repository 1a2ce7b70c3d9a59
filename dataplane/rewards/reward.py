"""A built reward: call each function of a :class:`RewardSpec` on a batch, catch what they do wrong, sum with weights.

``Reward(prompts, completions, **columns) -> list[float]`` is what a task calls; each function gets TRL's
``reward_funcs`` arguments, by keyword as TRL passes them (``fn(prompts=..., completions=..., **columns)``: so
``def f(completions, **kwargs)`` works too; the dataset's extra columns as lists, plus the function's ``options``)
and returns one score per completion, or ``None`` where it does not apply (TRL's convention: that function adds
nothing to that record).

A user's function is a stranger's code running inside a worker: whatever it does wrong costs one record, never the
worker. A call that raises is repeated record by record so that one bad record does not zero its batch; a record it
still cannot score, and one it scores with something that is not a finite number within the records' bound
(``MAX_REWARD``), gets the function's ``fallback`` (0 unless the spec says otherwise) and is counted in
:class:`RewardStats`, which the agent reports to the site per job (docs/rewards.md).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import inspect
import math
import numbers
import os
import sys
import threading
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from ..records import MAX_REWARD
from .builtins import SCORERS, MathVerifyMissing
from .spec import RewardError, RewardFunctionSpec, RewardSpec, ScorerMissing, UserCodeRefused, parse_reward_spec

MAX_ERROR_TEXT = 200
MAX_TRACEBACK = 4000


@dataclass(frozen=True)
class RewardStats:
    """What a reward's functions did wrong: ``calls`` (function calls on a batch), ``errors`` (records a function
    failed to score: it raised, or returned no list of one number per completion), ``non_finite`` (records scored
    NaN, an infinity or beyond +-MAX_REWARD), ``last_error`` (the latest, one short line)."""

    calls: int = 0
    errors: int = 0
    non_finite: int = 0
    last_error: str = ""
    last_traceback: str = ""  # the latest failure's traceback (at most MAX_TRACEBACK characters), for the owner
    failed: dict[str, int] = field(default_factory=dict)  # records each function failed on (errors and non-finite)
    last_errors: dict[str, str] = field(default_factory=dict)  # each function's latest failure, one short line

    def minus(self, earlier: RewardStats) -> RewardStats:
        """What happened since ``earlier`` (a snapshot of the same reward): the agent reports these deltas."""
        failed = {name: n - earlier.failed.get(name, 0) for name, n in self.failed.items()
                  if n > earlier.failed.get(name, 0)}
        return RewardStats(calls=self.calls - earlier.calls, errors=self.errors - earlier.errors,
                           non_finite=self.non_finite - earlier.non_finite,
                           last_error=self.last_error if self.errors + self.non_finite
                           > earlier.errors + earlier.non_finite else "",
                           last_traceback=self.last_traceback if self.errors > earlier.errors else "",
                           failed=failed, last_errors={name: self.last_errors[name] for name in failed
                                                       if name in self.last_errors})


@dataclass(frozen=True)
class TrainerState:
    """What TRL's ``trainer_state`` gives a reward function that ECHO-2's learner knows."""

    global_step: int  # the learner's version when the record was read (TRL: the optimizer steps so far)
    max_steps: int
    epoch: float = 0.0


def error_text(err: BaseException, function: str) -> str:
    """``function: Type: message``, one line, at most ``MAX_ERROR_TEXT`` characters."""
    message = str(err).replace("\x00", "\\0").strip()
    message = message.splitlines()[0] if message else ""
    text = f"{function}: {type(err).__name__}" + (f": {message}" if message else "")
    return text if len(text) <= MAX_ERROR_TEXT else text[: MAX_ERROR_TEXT - 3] + "..."


class _Scorer:
    """One function of the sum, with its weight and fallback."""

    def __init__(self, spec: RewardFunctionSpec, fn: Callable[..., Any], options: dict[str, Any]) -> None:
        self.spec, self.fn, self.options = spec, fn, options

    def call(self, prompts: list[Any], completions: list[Any], columns: dict[str, Sequence[Any]],
             shared: dict[str, Any]) -> list[Any]:
        # As TRL calls: everything by keyword, an ``async def`` function awaited.
        out = self.fn(prompts=prompts, completions=completions, **columns, **shared, **self.options)
        if inspect.isawaitable(out):
            out = _await(out)
        if isinstance(out, str | bytes) or not isinstance(out, Sequence) or len(out) != len(completions):
            got = f"{len(out)} values" if isinstance(out, Sequence) else type(out).__name__
            raise TypeError(f"returned {got}, expected a list of {len(completions)} floats")
        return list(out)


class Reward:
    """The weighted sum of a :class:`RewardSpec`'s functions; see the module's docstring."""

    def __init__(self, spec: RewardSpec, scorers: list[_Scorer]) -> None:
        self.spec = spec
        self._scorers = scorers
        self._lock = threading.Lock()
        self._stats = RewardStats()

    @property
    def stats(self) -> RewardStats:
        """Everything counted so far (a frozen snapshot)."""
        return self._stats

    def __call__(self, prompts: list[Any], completions: list[Any], *, shared: dict[str, Any] | None = None,
                 **columns: Sequence[Any]) -> list[float]:
        """The weighted sums. ``columns`` are lists aligned with the completions (a record scored alone gets its
        slice), ``shared`` what every call gets whole (TRL's ``trainer_state``)."""
        return self.each(prompts, completions, shared=shared, **columns)[0]

    def each(self, prompts: list[Any], completions: list[Any], *, shared: dict[str, Any] | None = None,
             **columns: Sequence[Any]) -> tuple[list[float], dict[str, list[float]]]:
        """The weighted sums and each function's own scores (by function name, unweighted)."""
        count = len(completions)
        if len(prompts) != count:
            raise ValueError(f"{len(prompts)} prompts for {count} completions")
        totals, each = [0.0] * count, {}
        for scorer in self._scorers:
            scores = self._scores(scorer, prompts, completions, columns, shared or {})
            each[scorer.spec.function] = scores
            for i, score in enumerate(scores):
                totals[i] += scorer.spec.weight * score
        return totals, each

    def check(self, prompts: list[Any], completions: list[Any], *, shared: dict[str, Any] | None = None,
              **columns: Sequence[Any]) -> str:
        """Call every function once on this batch, catching nothing on its behalf: "" when each returned a number
        (or None) per completion, else the first failure as the owner needs it (the function, what it did, and
        for an exception its traceback)."""
        for scorer in self._scorers:
            name = scorer.spec.function
            try:
                values = scorer.call(prompts, completions, columns, shared or {})
            except Exception as err:  # noqa: BLE001 - any error of the owner's function is what this reports
                return f"reward function {name} raised on {len(completions)} rows of the data set:\n" \
                       f"{owner_traceback(err)[-MAX_TRACEBACK:]}"
            bad = [v for v in values if v is not None and not (isinstance(v, numbers.Real) and math.isfinite(v))]
            if bad:
                return f"reward function {name} returned {bad[0]!r:.60} ({type(bad[0]).__name__}), not a number, " \
                       f"on {len(completions)} rows of the data set"
        return ""

    def _scores(self, scorer: _Scorer, prompts: list[Any], completions: list[Any],
                columns: dict[str, Sequence[Any]], shared: dict[str, Any]) -> list[float]:
        """One function's scores of a batch, every failure replaced by its fallback and counted."""
        self._count(calls=1)
        try:
            raw = scorer.call(prompts, completions, columns, shared)
        except Exception:  # noqa: BLE001 - a user's function may raise anything; find the records at fault
            raw = [self._one(scorer, i, prompts, completions, columns, shared) for i in range(len(completions))]
        return [self._finite(scorer, value) for value in raw]

    def _one(self, scorer: _Scorer, i: int, prompts: list[Any], completions: list[Any],
             columns: dict[str, Sequence[Any]], shared: dict[str, Any]) -> Any:
        """Record ``i`` scored alone (its batch raised); a failure is the fallback, counted."""
        self._count(calls=1)
        try:
            return scorer.call(prompts[i:i + 1], completions[i:i + 1], {k: v[i:i + 1] for k, v in columns.items()},
                               shared)[0]
        except Exception as err:  # noqa: BLE001 - counted and reported, never raised into the worker
            self._count(errors=1, last_error=error_text(err, scorer.spec.function),
                        last_traceback=traceback.format_exc()[-MAX_TRACEBACK:], function=scorer.spec.function)
            return None if scorer.spec.fallback == 0.0 else scorer.spec.fallback

    def _finite(self, scorer: _Scorer, value: Any) -> float:
        if value is None:  # the function does not apply to this record (TRL), or it failed with fallback 0
            return 0.0
        if isinstance(value, numbers.Real):
            number = float(value)
            if math.isfinite(number) and abs(number) <= MAX_REWARD:
                return number
        self._count(non_finite=1, last_error=f"{scorer.spec.function}: returned {value!r:.60}, not a finite number",
                    function=scorer.spec.function)
        return scorer.spec.fallback

    def _count(self, *, calls: int = 0, errors: int = 0, non_finite: int = 0, last_error: str = "",
               last_traceback: str = "", function: str = "") -> None:
        with self._lock:
            s = self._stats
            failed, last_errors = s.failed, s.last_errors
            if function:  # a failure: counted for its function too (the job page shows each function's rate)
                failed = {**failed, function: failed.get(function, 0) + errors + non_finite}
                last_errors = {**last_errors, function: last_error}
            self._stats = replace(s, calls=s.calls + calls, errors=s.errors + errors,
                                  non_finite=s.non_finite + non_finite, last_error=last_error or s.last_error,
                                  last_traceback=last_traceback or s.last_traceback, failed=failed,
                                  last_errors=last_errors)


def owner_traceback(err: BaseException) -> str:
    """``err``'s traceback from the owner's code on: the frames of this module (the call into the function) left
    out."""
    tb = err.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename == __file__:
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(err), err, tb)).strip()


def _await(awaitable: Any) -> Any:
    """The result of an ``async def`` reward function's call: on a loop of its own (on a thread of its own when
    this thread already runs one, as an agent's may)."""
    async def wait() -> Any:
        return await awaitable

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(wait())
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        return pool.submit(asyncio.run, wait()).result()


def build_reward(spec: Any, *, allow_user_code: bool, field: str = "reward") -> Reward:
    """Build the reward of ``spec`` (a :class:`RewardSpec` or any shape it parses). User functions are imported only
    with ``allow_user_code`` (an agent run with ``--allow-user-code``, or the learner: the owner's machine), else
    :class:`UserCodeRefused`. Raise :class:`RewardError` naming the field for anything else wrong."""
    parsed = parse_reward_spec(spec, field=field)
    refused = parsed.user_functions
    if refused and not allow_user_code:
        raise UserCodeRefused(f"{field}: runs user code ({', '.join(refused)}) and this worker does not run user code "
                              "(its provider did not start it with `echo2-agent run --allow-user-code`)")
    return Reward(parsed, [_scorer(f, f"{field}.functions.{i}") for i, f in enumerate(parsed.functions)])


def _scorer(spec: RewardFunctionSpec, where: str) -> _Scorer:
    if not spec.is_user_code:
        factory = SCORERS[spec.function]
        known = set(inspect.signature(factory).parameters)
        unknown = sorted(set(spec.options) - known)
        if unknown:
            raise RewardError(f"{where}.options: unknown option {unknown[0]!r} of {spec.function} (its options: "
                              f"{', '.join(sorted(known))})")
        try:
            return _Scorer(spec, factory(**spec.options), {})
        except MathVerifyMissing as err:
            raise ScorerMissing(f"{where}: {err}") from None
        except ValueError as err:
            raise RewardError(f"{where}.options.{err}") from None
    fn = load_function(spec.function, where=f"{where}.function")
    if spec.factory is not None:
        try:
            fn = fn(**spec.factory)
        except Exception as err:  # noqa: BLE001 - the owner's factory may raise anything: a bad spec
            raise RewardError(f"{where}.factory: {error_text(err, spec.function)}") from None
        if not callable(fn):
            raise RewardError(f"{where}.factory: {spec.function} returned {type(fn).__name__}, not a function")
    return _Scorer(spec, fn, dict(spec.options))


def import_owner_module(name: str) -> Any:
    """Import the owner's module ``name`` as a script run here would: from the import path, else from the working
    directory (appended to the path once, after everything else, so it shadows nothing): a learner or an agent
    started in the owner's checkout finds ``examples.rewards.sums_rewards`` with no ``PYTHONPATH``."""
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        here = os.getcwd()
        if here in sys.path or err.name is None or not name.startswith(err.name):
            raise
        sys.path.append(here)
        return importlib.import_module(name)


def load_function(name: str, *, where: str) -> Callable[..., Any]:
    """Import ``pkg.module:attr.path`` and return it; :class:`RewardError` naming ``where`` if it cannot."""
    module_name, _, attr_path = name.partition(":")
    try:
        target: Any = import_owner_module(module_name)
        for attr in attr_path.split("."):
            target = getattr(target, attr)
    except Exception as err:  # noqa: BLE001 - importing a user's module runs its code: any error is a bad spec
        raise RewardError(f"{where}: cannot load {name!r} ({error_text(err, module_name)})") from None
    if not callable(target):
        raise RewardError(f"{where}: {name!r} is not callable")
    return target

"""Built-in scorers: functions every worker may run without the provider's opt-in (they are ours, not user code).

Each is a factory ``make(**options) -> fn`` whose ``fn(prompts, completions, **columns) -> list[float]`` has TRL's
``reward_funcs`` signature and scores in [0, 1]. A bad option raises ``ValueError("option: ...")``; the builder
(``dataplane/rewards/reward.py``) prefixes the field path.

- ``math_verify``: the completion's final answer checked against the answer column by Hugging Face's
  ``math-verify`` (what TRL and open-r1 use): ``verify(parse(answer), parse(completion))``. Installed with
  ``pip install 'echo2[math]'``, imported on first build.
- ``exact_match``: the completion (or what ``pattern``'s first group extracts from it) equals the answer column,
  both normalized (stripped, whitespace collapsed, case folded unless ``case_sensitive``).
- ``regex``: ``pattern`` found anywhere in the completion (``re.search``).
- ``format``: the whole stripped completion matches ``pattern`` (``re.fullmatch``), as TRL's format rewards do
  (``^<think>.*?</think><answer>.*?</answer>$``).
"""

from __future__ import annotations

import re
import threading
from collections.abc import Callable, Sequence
from typing import Any

ScoreFn = Callable[..., list[float]]

MAX_PATTERN = 1000
FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE}


class MathVerifyMissing(ImportError):
    """``math_verify`` named and the ``math-verify`` package is not installed."""


def _column(columns: dict[str, Any], name: str, count: int) -> Sequence[Any]:
    values = columns.get(name)
    if values is None:
        raise KeyError(f"the dataset has no {name!r} column (columns: {', '.join(sorted(columns)) or 'none'})")
    if len(values) != count:
        raise ValueError(f"column {name!r} has {len(values)} values for {count} completions")
    return values


def text_of(completion: Any) -> str:
    """A completion's text: itself, or for a chat (TRL's ``[{"role": "assistant", "content": ...}]``) its last
    message's content."""
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        return str(completion[-1].get("content", ""))
    return str(completion)


def _compile(pattern: Any, flags: Any) -> re.Pattern[str]:
    if not isinstance(pattern, str) or not pattern or len(pattern) > MAX_PATTERN:
        raise ValueError(f"pattern: must be a regular expression of 1 to {MAX_PATTERN} characters")
    if not isinstance(flags, str) or set(flags) - set(FLAGS):
        raise ValueError(f"flags: must be letters among {''.join(FLAGS)}")
    bits = 0
    for letter in flags:
        bits |= FLAGS[letter]
    try:
        return re.compile(pattern, bits)
    except re.error as err:
        raise ValueError(f"pattern: not a regular expression ({err})") from None


def regex(*, pattern: Any = None, flags: Any = "s") -> ScoreFn:
    compiled = _compile(pattern, flags)

    def score(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [1.0 if compiled.search(text_of(c)) else 0.0 for c in completions]
    return score


def format_(*, pattern: Any = None, flags: Any = "s") -> ScoreFn:
    compiled = _compile(pattern, flags)

    def score(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        return [1.0 if compiled.fullmatch(text_of(c).strip()) else 0.0 for c in completions]
    return score


def normalize(text: Any, *, case_sensitive: bool = False) -> str:
    """Strip, collapse whitespace, drop a trailing period, fold case (unless ``case_sensitive``)."""
    out = " ".join(str(text).split()).rstrip(".")
    return out if case_sensitive else out.casefold()


def exact_match(*, column: Any = "answer", pattern: Any = None, flags: Any = "s",
                case_sensitive: Any = False) -> ScoreFn:
    if not isinstance(column, str) or not column:
        raise ValueError("column: must be a column name")
    if not isinstance(case_sensitive, bool):
        raise ValueError("case_sensitive: must be true or false")
    extract = _compile(pattern, flags) if pattern is not None else None
    if extract is not None and extract.groups < 1:
        raise ValueError("pattern: must have a group capturing the answer, e.g. <answer>(.*?)</answer>")

    def answer_of(completion: str) -> str | None:
        if extract is None:
            return completion
        found = extract.findall(completion)
        if not found:
            return None
        last = found[-1]
        return last[0] if isinstance(last, tuple) else last

    def score(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        answers = _column(columns, column, len(completions))
        out = []
        for completion, answer in zip(completions, answers, strict=True):
            given = answer_of(text_of(completion))
            out.append(1.0 if given is not None and normalize(given, case_sensitive=case_sensitive)
                       == normalize(answer, case_sensitive=case_sensitive) else 0.0)
        return out
    return score


def _math_verify():
    try:
        import math_verify
    except ImportError:
        raise MathVerifyMissing("the math_verify scorer needs the math-verify package: pip install 'echo2[math]'") \
            from None
    return math_verify


def math_verify(*, column: Any = "answer", timeout_s: Any = 5) -> ScoreFn:
    if not isinstance(column, str) or not column:
        raise ValueError("column: must be a column name")
    if not isinstance(timeout_s, int) or isinstance(timeout_s, bool) or not 1 <= timeout_s <= 60:
        raise ValueError("timeout_s: must be an integer between 1 and 60")
    mv = _math_verify()

    def gold_of(answer: Any) -> list:
        text = str(answer)
        gold = mv.parse(text, **limits())
        return gold or mv.parse(f"${text}$", **limits())  # a bare "\frac12" or "x^2" has no anchor

    def limits() -> dict[str, Any]:
        # math-verify times out with SIGALRM, which only the main thread may set: the agent scores in a worker
        # thread, where it runs without the timeout (the completion's length is bounded by max_new_tokens).
        main = threading.current_thread() is threading.main_thread()
        return {"parsing_timeout": timeout_s if main else None}

    def score(prompts: list[str], completions: list[str], **columns: Any) -> list[float]:
        answers = _column(columns, column, len(completions))
        timeout = {"timeout_seconds": limits()["parsing_timeout"]}
        out = []
        for completion, answer in zip(completions, answers, strict=True):
            gold, given = gold_of(answer), mv.parse(text_of(completion), **limits())
            out.append(1.0 if gold and given and mv.verify(gold, given, **timeout) else 0.0)
        return out
    return score


#: The built-in scorers by the name a reward spec uses.
SCORERS: dict[str, Callable[..., ScoreFn]] = {
    "math_verify": math_verify,
    "exact_match": exact_match,
    "regex": regex,
    "format": format_,
}

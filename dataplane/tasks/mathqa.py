"""Math word problems with verifiable final answers (paper section 5.1: DAPO-Math, AIME).

Problems come from a JSONL file, one ``{"problem": ..., "answer": ...}`` per line. A completion
scores 1 when its final answer -- the last ``\\boxed{...}`` (nested braces allowed) or, failing that,
the last GSM8K-style ``#### n`` line -- equals the reference answer after normalization, else 0
(wrong, no final answer, unbalanced braces).

Why an index: a worker scores from the prompt text alone (paper 4.1: ``r = R(x, y)`` is computed in
the rollout plane), and the answer is never in the prompt. So both the learner (which samples prompts)
and every worker (which scores them) load the *same* file and keep a map ``prompt text -> answer``.
The worker has the path from the job's task spec; the spec also carries the file's sha256 (filled in
when the site validates the job), so a worker whose copy differs refuses the job instead of scoring
against the wrong answers. A prompt that is not in the file scores 0.

``path`` may be ``builtin:<file>`` for a file shipped in ``dataplane/tasks/data/`` (installed with the
agent, so every machine has it): ``builtin:math_sample.jsonl`` is a tiny sample for demos and tests.
The file is read under the process's policy (``dataplane.tasks.files``): any path on the learner's and agents'
machines, only under ``ECHO2_TASK_DATA_ROOT`` and size-capped at the site.
"""

from __future__ import annotations

import hashlib
import json
import random
import re
from fractions import Fraction
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task
from .files import DATA_DIR, read_task_file  # noqa: F401  (DATA_DIR: where builtin: files are, named here too)

DEFAULT_TEMPLATE = "{problem}\nPut the final answer in \\boxed{}."
MAX_LINE_CHARS = 100_000

_BOX = re.compile(r"\\(?:boxed|fbox)")
_HASHES = re.compile(r"####[ \t]*([^\n]*)")
_TEXT = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")
_DROP = re.compile(r"\\left|\\right|\\displaystyle|\\[!,;:]|\\\s|\$|\^\{?\\circ\}?|\\?%")
_THOUSANDS = re.compile(r"^-?\d{1,3}(,\d{3})+(\.\d+)?$")
_ASSIGN = re.compile(r"^[a-zA-Z]\s*=(?!=)")
_NUM = r"[+-]?(?:\d+\.?\d*|\.\d+)"
_DECIMAL = re.compile(rf"^{_NUM}$")
_SLASH = re.compile(rf"^({_NUM})/({_NUM})$")
_FRAC = re.compile(rf"^([+-]?)\\frac\{{({_NUM})\}}\{{({_NUM})\}}$")
_FRAC_SHORT = re.compile(r"^([+-]?)\\frac(\d)(\d)$")  # \frac12


def last_boxed(text: str) -> str | None:
    """Content of the last ``\\boxed{...}`` in ``text`` (braces may nest); None when absent or unbalanced."""
    matches = list(_BOX.finditer(text))
    if not matches:
        return None
    start = matches[-1].end()
    rest = text[start:].lstrip()
    if not rest.startswith("{"):  # "\boxed 5": the argument is the next word
        word = rest.split(maxsplit=1)[0] if rest.split() else ""
        return word.rstrip("$.") or None
    depth = 0
    for i, ch in enumerate(rest):
        depth += {"{": 1, "}": -1}.get(ch, 0)
        if depth == 0:
            return rest[1:i]
    return None


def extract_answer(completion: str) -> str | None:
    """The final answer of a completion: the last ``\\boxed{}``, else the last ``#### n``, else None."""
    boxed = last_boxed(completion)
    if boxed is not None:
        return boxed
    hashes = _HASHES.findall(completion)
    if not hashes:
        return None
    return hashes[-1].strip() or None


def normalize(answer: str) -> str:
    """Canonical text of an answer: no spaces, ``$``, ``\\left``/``\\right``, ``\\dfrac``, units markup."""
    s = answer.replace("\\dfrac", "\\frac").replace("\\tfrac", "\\frac")
    s = _TEXT.sub(r"\1", s)
    s = _DROP.sub("", s)
    s = "".join(s.split()).rstrip(".")
    s = _ASSIGN.sub("", s, count=1) if _ASSIGN.match(s) and len(s) > 2 else s
    if _THOUSANDS.match(s):
        s = s.replace(",", "")
    return s


def to_number(answer: str) -> Fraction | None:
    """Exact value of a normalized numeric answer (``12``, ``3.750``, ``5/2``, ``-\\frac{1}{6}``), else None."""
    try:
        if _DECIMAL.match(answer):
            return Fraction(answer)
        if match := _SLASH.match(answer):
            return Fraction(match[1]) / Fraction(match[2])
        if match := _FRAC.match(answer) or _FRAC_SHORT.match(answer):
            value = Fraction(match[2]) / Fraction(match[3])
            return -value if match[1] == "-" else value
    except ZeroDivisionError:
        return None
    return None


def _value(answer: str) -> Fraction | None:
    """The number an answer states, ignoring a ``\\text{...}`` unit (``12 \\text{ cm}``)."""
    value = to_number(normalize(answer))
    return value if value is not None else to_number(normalize(_TEXT.sub("", answer)))


def answers_match(given: str, reference: str) -> bool:
    """Equal as numbers (fractions and decimals are the same value) or, when not numbers, as normalized text."""
    a, b = normalize(given), normalize(reference)
    x, y = _value(given), _value(reference)
    if x is not None and y is not None:
        return x == y
    return bool(a) and a == b


@register_task
class MathTask(TaskAdapter):
    name = "math"
    reward_range = (0.0, 1.0)  # 1 for a right answer, else 0

    def __init__(self, *, path: str, template: str = DEFAULT_TEMPLATE, sha256: str | None = None) -> None:
        if not isinstance(path, str) or not path:
            raise TaskSpecError("path: must be the path of a JSONL file of {\"problem\", \"answer\"} lines")
        if not isinstance(template, str) or "{problem}" not in template:
            raise TaskSpecError("template: must be a string containing '{problem}'")
        if sha256 is not None and not (isinstance(sha256, str) and re.fullmatch(r"[0-9a-f]{64}", sha256)):
            raise TaskSpecError("sha256: must be 64 lowercase hex digits")
        raw = read_task_file(path)
        digest = hashlib.sha256(raw).hexdigest()
        if sha256 is not None and sha256 != digest:
            raise TaskSpecError(f"sha256: {path!r} has sha256 {digest[:12]}..., the job expects {sha256[:12]}...; "
                                "this machine's copy of the file differs")
        self.path, self.template, self.sha256 = path, template, digest
        self.answers = self._index(raw.decode("utf-8", errors="replace"), path)
        self.prompts = list(self.answers)
        self.alphabet = "".join(sorted(set("".join(self.prompts) + "".join(self.answers.values())
                                           + "0123456789+-*/.,()# \\boxed{}")))

    def _index(self, text: str, path: str) -> dict[str, str]:
        answers: dict[str, str] = {}
        for number, line in enumerate(text.splitlines(), start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line[:MAX_LINE_CHARS])
            except json.JSONDecodeError as err:
                raise TaskSpecError(f"path: {path} line {number}: not JSON ({err.msg})") from None
            if not isinstance(row, dict) or not isinstance(row.get("problem"), str) or not row["problem"].strip():
                raise TaskSpecError(f"path: {path} line {number}: expected a non-empty string 'problem'")
            answer = row.get("answer")
            if isinstance(answer, bool) or not isinstance(answer, str | int | float) or not str(answer).strip():
                raise TaskSpecError(f"path: {path} line {number}: expected an 'answer' (string or number)")
            prompt = self.template.replace("{problem}", row["problem"])
            if answers.setdefault(prompt, str(answer)) != str(answer):
                raise TaskSpecError(f"path: {path} line {number}: the same problem appears with another answer")
        if not answers:
            raise TaskSpecError(f"path: {path} holds no problems")
        return answers

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "path": self.path, "template": self.template, "sha256": self.sha256}

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        return [Prompt(text=rng.choice(self.prompts)) for _ in range(count)]

    def answer(self, prompt: str) -> str | None:
        return self.answers.get(prompt)

    def reward(self, prompt: str, completion: str) -> float:
        reference = self.answers.get(prompt)
        given = extract_answer(completion)
        if reference is None or given is None:
            return 0.0
        return 1.0 if answers_match(given, reference) else 0.0

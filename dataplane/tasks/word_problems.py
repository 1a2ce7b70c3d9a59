"""GSM8K-shaped word problems the project generates itself, with a seeded train/held-out split.

Why generated: GSM8K itself is a download, and a 135 M model answers almost none of it. These are one- and two-step
problems written from templates over names, objects, quantities and operations (add, take away, multiply, share,
compare), every answer a whole number, so a small instruct model answers some of them and has room to learn.

**The split is honest.** ``size`` distinct problems (by template and numbers) are drawn with ``seed``, and the first
``test_size`` drawn are held out; ``split = "train"`` samples only from the rest, ``split = "test"`` lists the
held-out ones (the learner's evaluation, learner/evaluation.py). Each split indexes only its own problems, so a
held-out prompt sent as training work scores 0; ``tests/dataplane/test_word_problems.py`` checks that no held-out
problem, nor one with its template and numbers, appears in the training split.

**The reward** is 1 when the completion's final number equals the answer, checked by Hugging Face's ``math-verify``
(``pip install 'echo2[math]'``): the number after the first ``####`` (GSM8K's answer line), or, unless
``require_hashes``, the last number of the completion. The job asks for the ``####`` line in its system prompt
(:data:`SYSTEM_PROMPT`, with ``prompt_format.chat``). As with ``math``, the answer is not in the prompt: every
machine rebuilds the same problems from the spec and keeps ``prompt text -> answer``.
"""

from __future__ import annotations

import random
import re
from collections.abc import Callable
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task

#: The system prompt the demo's job gives this task (``prompt_format.system_prompt``). With it SmolLM2-135M-Instruct
#: answers 16 of the 200 held-out problems greedily in 48 tokens and 8.6 % of its answers sampled at temperature 0.7
#: (``scripts/probe_word_problems.py``). A prompt that showed an example (``#### 42``) had half the sampled rate: a
#: third of the answers copied the example. Asked to "reason briefly" the model spent its tokens explaining.
SYSTEM_PROMPT = "Solve the problem. End your answer with the final number on its own line, written after ####."
SPLITS = ("train", "test")
MAX_TRIES_PER_PROBLEM = 50

NAMES = ("Ava", "Ben", "Carla", "Dev", "Emma", "Farid", "Grace", "Hugo", "Ines", "Jack", "Kira", "Liam", "Maya",
         "Noah", "Olga", "Pedro", "Quinn", "Rosa", "Sam", "Tara", "Umar", "Vera", "Will", "Yuki", "Zoe")
THINGS = ("apples", "marbles", "stickers", "books", "pencils", "cookies", "stamps", "shells", "cards", "eggs",
          "flowers", "coins", "balloons", "candies", "toy cars")

_HASHES = re.compile(r"####\s*\**\s*\$?\s*([-+]?\d[\d,]*(?:\.\d+)?)")
_NUMBER = re.compile(r"[-+]?\d[\d,]*(?:\.\d+)?")

Draw = Callable[[random.Random, str, str, str], tuple[str, int]]


def _add(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    x, y = r.randint(2, 30), r.randint(2, 30)
    return f"{a} has {x} {t}. {b} gives {a} {y} more {t}. How many {t} does {a} have now?", x + y


def _take(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    y = r.randint(2, 25)
    x = y + r.randint(1, 30)
    return f"{a} had {x} {t} and gave {y} of them to {b}. How many {t} does {a} have left?", x - y


def _times(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    x, y = r.randint(2, 9), r.randint(2, 12)
    return f"{a} buys {x} bags of {t}. Each bag holds {y} {t}. How many {t} does {a} buy in all?", x * y


def _share(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    each, friends = r.randint(2, 12), r.randint(2, 8)
    return (f"{a} shares {each * friends} {t} equally among {friends} friends. How many {t} does each friend "
            f"get?", each)


def _more_than(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    x, y = r.randint(2, 25), r.randint(2, 15)
    return (f"{a} has {x} {t}. {b} has {y} more {t} than {a}. How many {t} do {a} and {b} have together?",
            2 * x + y)


def _boxes(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    per, boxes = r.randint(2, 10), r.randint(2, 6)
    z = r.randint(1, per * boxes - 1)
    return (f"A box holds {per} {t}. {a} fills {boxes} boxes, then gives {z} {t} to {b}. How many {t} does {a} "
            f"have left?", per * boxes - z)


def _lose_find(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    y = r.randint(1, 15)
    x, z = y + r.randint(1, 20), r.randint(1, 15)
    return f"{a} has {x} {t}. {a} loses {y} of them and then finds {z} more. How many {t} does {a} have now?", \
        x - y + z


def _wage(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    pay, days = r.randint(3, 20), r.randint(2, 7)
    spent = r.randint(1, pay * days - 1)
    return (f"{a} earns {pay} dollars a day for {days} days and then spends {spent} dollars. How many dollars "
            f"does {a} have left?", pay * days - spent)


def _twice(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    x = r.randint(2, 30)
    return (f"{a} collects {x} {t} on Monday and twice as many on Tuesday. How many {t} does {a} collect on the "
            f"two days together?", 3 * x)


def _rows(r: random.Random, a: str, b: str, t: str) -> tuple[str, int]:
    rows, per = r.randint(2, 9), r.randint(2, 10)
    taken = r.randint(1, rows * per - 1)
    return (f"{a} puts {t} in {rows} rows with {per} {t} in each row. {b} takes {taken} of them. How many {t} are "
            f"still in the rows?", rows * per - taken)


#: The problem templates: each draws its numbers with the generator it is given and returns (problem, answer).
TEMPLATES: tuple[Draw, ...] = (_add, _take, _times, _share, _more_than, _boxes, _lose_find, _wage, _twice, _rows)


def generate(seed: int, size: int) -> list[tuple[str, int]]:
    """``size`` distinct problems with their answers, in the seeded order the split cuts. Distinct means another
    template or other numbers: two problems that differ only in names or objects are the same problem, so only
    the first drawn is kept (a held-out problem is never a training one renamed)."""
    return [(problem, answer) for _, problem, answer in generate_named(seed, size)]


def generate_named(seed: int, size: int) -> list[tuple[str, str, int]]:
    """:func:`generate`'s problems with the name of the template each was drawn from (``add``, ``times``, ...)."""
    rng = random.Random(f"word_problems/{seed}")
    seen: dict[tuple[str, tuple[str, ...]], tuple[str, str, int]] = {}
    for _ in range(size * MAX_TRIES_PER_PROBLEM):
        if len(seen) == size:
            break
        a, b = rng.sample(NAMES, 2)
        draw = rng.choice(TEMPLATES)
        problem, answer = draw(rng, a, b, rng.choice(THINGS))
        seen.setdefault((draw.__name__, tuple(_NUMBER.findall(problem))), (draw.__name__.lstrip("_"), problem, answer))
    if len(seen) < size:
        raise TaskSpecError(f"size: only {len(seen)} distinct problems could be generated; ask for fewer")
    return list(seen.values())


def final_number(completion: str, *, require_hashes: bool = False) -> str | None:
    """The completion's final answer: the number after its first ``####`` (lm-evaluation-harness's GSM8K
    strict-match: a model that repeats the line until its tokens run out is judged by the line it wrote first), else
    (unless ``require_hashes``) its last number; None when there is none."""
    hashes = _HASHES.findall(completion)
    if hashes:
        return hashes[0].replace(",", "")
    if require_hashes:
        return None
    numbers = _NUMBER.findall(completion)
    return numbers[-1].replace(",", "") if numbers else None


@register_task
class WordProblemsTask(TaskAdapter):
    name = "word_problems"
    reward_range = (0.0, 1.0)  # 1 for a right final number, else 0

    def __init__(self, *, split: str = "train", seed: int = 0, size: int = 2000, test_size: int = 200,
                 template: str = "{problem}", require_hashes: bool = False) -> None:
        if split not in SPLITS:
            raise TaskSpecError(f"split: must be one of {', '.join(SPLITS)}, got {split!r}")
        if not isinstance(seed, int) or isinstance(seed, bool) or not 0 <= seed < 2**31:
            raise TaskSpecError("seed: must be an integer between 0 and 2147483647")
        if not isinstance(size, int) or isinstance(size, bool) or not 10 <= size <= 10_000:
            raise TaskSpecError("size: must be an integer between 10 and 10000")
        if not isinstance(test_size, int) or isinstance(test_size, bool) or not 1 <= test_size <= size // 2:
            raise TaskSpecError(f"test_size: must be an integer between 1 and size/2 ({size // 2})")
        if not isinstance(template, str) or "{problem}" not in template or len(template) > 2000:
            raise TaskSpecError("template: must be a string (at most 2000 characters) containing '{problem}'")
        if not isinstance(require_hashes, bool):
            raise TaskSpecError("require_hashes: must be true or false")
        self.split, self.seed, self.size, self.test_size = split, seed, size, test_size
        self.template, self.require_hashes = template, require_hashes
        problems = generate(seed, size)
        chosen = problems[:test_size] if split == "test" else problems[test_size:]
        self.answers = {template.replace("{problem}", problem): str(answer) for problem, answer in chosen}
        self.prompts = list(self.answers)  # this split's, in the seeded order (an evaluation takes the first N)
        self.alphabet = "".join(sorted(set("".join(self.prompts)) | set("0123456789#+-*/=.,: \n")))
        self._verify = _math_verify()

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "split": self.split, "seed": self.seed, "size": self.size,
                "test_size": self.test_size, "template": self.template, "require_hashes": self.require_hashes}

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        return [Prompt(text=rng.choice(self.prompts)) for _ in range(count)]

    def answer(self, prompt: str) -> str | None:
        return self.answers.get(prompt)

    def reward(self, prompt: str, completion: str) -> float:
        reference = self.answers.get(prompt)
        given = final_number(completion, require_hashes=self.require_hashes)
        if reference is None or given is None:
            return 0.0
        try:
            return self._verify([prompt], [given], answer=[reference])[0]
        except Exception:  # noqa: BLE001 - a scorer's failure on odd text scores the answer 0, never raises
            return 0.0


def _math_verify() -> Callable[..., list[float]]:
    """The built-in ``math_verify`` scorer (dataplane/rewards/builtins.py), or a TaskSpecError naming the extra."""
    from ..rewards.builtins import MathVerifyMissing, math_verify

    try:
        return math_verify()
    except MathVerifyMissing as err:
        raise TaskSpecError(f"word_problems: {err}") from None

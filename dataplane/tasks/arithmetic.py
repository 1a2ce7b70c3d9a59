"""A synthetic arithmetic task a tiny model can learn from scratch.

Prompts are ``"a+b="``; the right answer is ``(a op b) mod modulus`` written in decimal. The answer
is computed from the prompt, never present in it, so a policy can only score by learning the
operation. The reward is 1 for the exact answer (leading/trailing spaces ignored), else 0.
"""

from __future__ import annotations

import operator
import random
import re
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task

_OPS = {"+": operator.add, "-": operator.sub, "*": operator.mul}
_PROMPT = re.compile(r"^(\d+)([+\-*])(\d+)=$")


@register_task
class ArithmeticTask(TaskAdapter):
    name = "arithmetic"
    reward_range = (0.0, 1.0)  # 1 for a right answer, else 0
    alphabet = "0123456789+-*= "

    def __init__(self, *, max_operand: int = 9, ops: str = "+", modulus: int = 10) -> None:
        if not isinstance(max_operand, int) or not 1 <= max_operand <= 10_000:
            raise TaskSpecError("max_operand: must be an integer between 1 and 10000")
        if not isinstance(ops, str) or not ops or any(op not in _OPS for op in ops):
            raise TaskSpecError(f"ops: use a string of {''.join(_OPS)}, got {ops!r}")
        # an answer is at most 10 digits: 10**300 made answers the engines cannot write in max_new_tokens
        if not isinstance(modulus, int) or isinstance(modulus, bool) or not 2 <= modulus <= 10**9:
            raise TaskSpecError("modulus: must be an integer between 2 and 1000000000")
        self.max_operand, self.ops, self.modulus = max_operand, ops, modulus

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "max_operand": self.max_operand, "ops": self.ops, "modulus": self.modulus}

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        out = []
        for _ in range(count):
            a, b = rng.randint(0, self.max_operand), rng.randint(0, self.max_operand)
            out.append(Prompt(text=f"{a}{rng.choice(self.ops)}{b}="))
        return out

    def answer(self, prompt: str) -> int | None:
        match = _PROMPT.match(prompt)
        if match is None:
            return None
        a, op, b = int(match[1]), match[2], int(match[3])
        return _OPS[op](a, b) % self.modulus

    def reward(self, prompt: str, completion: str) -> float:
        expected = self.answer(prompt)
        if expected is None:
            return 0.0
        return 1.0 if completion.strip() == str(expected) else 0.0

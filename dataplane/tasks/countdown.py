"""Countdown: reach a target from given numbers with + - * / and parentheses, each number at most once.

Prompts state the numbers and the target; the reward is computed from the prompt text alone. The
target is built from a random expression over all the numbers (exact arithmetic, only integer
targets kept), so every prompt has a solution.

The completion's expression (inside the last ``<answer>...</answer>``, else its last non-empty line;
anything from ``=`` on is ignored) is parsed with :mod:`ast`, never evaluated as code: only integer
literals, the four binary operators and parentheses are accepted, arithmetic is exact
(:class:`fractions.Fraction`, so ``(1+1/3)*3 == 4``), division by zero is malformed, and the numbers
used must be a sub-multiset of the given ones. Reward 1 on reaching the target, else 0.
"""

from __future__ import annotations

import ast
import operator
import random
import re
from collections import Counter
from fractions import Fraction
from typing import Any

from .base import Prompt, TaskAdapter, TaskSpecError, register_task

TEMPLATE = ("Using the numbers {numbers}, make {target}. Use each number at most once, with + - * / and "
            "parentheses. Answer with the expression in <answer></answer>.\n")
_PROMPT = re.compile(r"^Using the numbers (\d+(?:, \d+)*), make (\d+)\. ")
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_EXPRESSION_CHARS = re.compile(r"^[\d+\-*/() ]+$")
_OPS: dict[type[ast.operator], Any] = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
                                       ast.Div: operator.truediv}
_SYMBOLS = {"+": ast.Add, "-": ast.Sub, "*": ast.Mult, "/": ast.Div}
MAX_EXPRESSION_CHARS = 200
BUILD_ATTEMPTS = 100


class MalformedExpression(ValueError):
    """An answer that is not an arithmetic expression over integer literals."""


def evaluate(expression: str) -> tuple[Fraction, list[int]]:
    """Exact value of ``expression`` and the integer literals it uses; raise MalformedExpression otherwise."""
    if len(expression) > MAX_EXPRESSION_CHARS or not _EXPRESSION_CHARS.match(expression):
        raise MalformedExpression("only digits, + - * / ( ) and spaces are allowed")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise MalformedExpression("not an expression") from None
    used: list[int] = []

    def walk(node: ast.AST) -> Fraction:
        if isinstance(node, ast.Constant) and type(node.value) is int:
            used.append(node.value)
            return Fraction(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Div) and right == 0:
                raise MalformedExpression("division by zero")
            return _OPS[type(node.op)](left, right)
        raise MalformedExpression(f"{type(node).__name__} is not allowed")

    try:
        return walk(tree.body), used
    except RecursionError:
        raise MalformedExpression("too deeply nested") from None


def parse_prompt(prompt: str) -> tuple[list[int], int] | None:
    match = _PROMPT.match(prompt)
    if match is None:
        return None
    return [int(x) for x in match[1].split(", ")], int(match[2])


def answer_expression(completion: str) -> str:
    tagged = _ANSWER.findall(completion)
    if tagged:
        text = tagged[-1]
    else:
        lines = [line for line in completion.splitlines() if line.strip()]
        text = lines[-1] if lines else ""
    return text.split("=", 1)[0].strip()


def solves(numbers: list[int], target: int, expression: str) -> bool:
    try:
        value, used = evaluate(expression)
    except MalformedExpression:
        return False
    return value == target and not Counter(used) - Counter(numbers)


@register_task
class CountdownTask(TaskAdapter):
    name = "countdown"
    reward_range = (0.0, 1.0)  # 1 for a right answer, else 0
    alphabet = "".join(sorted(set(TEMPLATE.replace("{numbers}", "").replace("{target}", "") + "0123456789+-*/()=<>")))

    def __init__(self, *, count: int = 4, max_number: int = 25, max_target: int = 1000, ops: str = "+-*/") -> None:
        if not isinstance(count, int) or isinstance(count, bool) or not 2 <= count <= 6:
            raise TaskSpecError("count: must be an integer between 2 and 6")
        if not isinstance(max_number, int) or isinstance(max_number, bool) or not 1 <= max_number <= 10_000:
            raise TaskSpecError("max_number: must be an integer between 1 and 10000")
        if not isinstance(max_target, int) or isinstance(max_target, bool) or not 1 <= max_target <= 1_000_000:
            raise TaskSpecError("max_target: must be an integer between 1 and 1000000")
        if not isinstance(ops, str) or not ops or any(op not in _SYMBOLS for op in ops) or len(set(ops)) != len(ops):
            raise TaskSpecError(f"ops: use a string of distinct {''.join(_SYMBOLS)}, got {ops!r}")
        if max_target < max_number:
            raise TaskSpecError("max_target: must be at least max_number")
        self.count, self.max_number, self.max_target, self.ops = count, max_number, max_target, ops

    def spec(self) -> dict[str, Any]:
        return {"name": self.name, "count": self.count, "max_number": self.max_number, "max_target": self.max_target,
                "ops": self.ops}

    def sample_prompts(self, rng: random.Random, count: int) -> list[Prompt]:
        out = []
        for _ in range(count):
            numbers, target, _ = self.make_problem(rng)
            out.append(Prompt(text=TEMPLATE.format(numbers=", ".join(map(str, numbers)), target=target)))
        return out

    def make_problem(self, rng: random.Random) -> tuple[list[int], int, str]:
        """Numbers, a reachable target and one expression reaching it (all numbers, random tree and ops)."""
        numbers = [rng.randint(1, self.max_number) for _ in range(self.count)]
        for _ in range(BUILD_ATTEMPTS):
            built = self._random_expression(rng, numbers)
            if built is not None and built[0].denominator == 1 and 1 <= built[0] <= self.max_target:
                return numbers, int(built[0]), built[1]
        # every draw failed (e.g. ops="/" over coprime numbers): a single number is still a valid answer
        return numbers, numbers[0], str(numbers[0])

    def _random_expression(self, rng: random.Random, numbers: list[int]) -> tuple[Fraction, str] | None:
        terms = [(Fraction(n), str(n)) for n in numbers]
        while len(terms) > 1:
            (a, left), (b, right) = terms.pop(rng.randrange(len(terms))), terms.pop(rng.randrange(len(terms)))
            op = rng.choice(self.ops)
            if op == "/" and b == 0:
                return None
            terms.append((_OPS[_SYMBOLS[op]](a, b), f"({left}{op}{right})"))
        value, expression = terms[0]
        return value, expression[1:-1] if expression.startswith("(") else expression

    def reward(self, prompt: str, completion: str) -> float:
        problem = parse_prompt(prompt)
        if problem is None:
            return 0.0
        numbers, target = problem
        return 1.0 if solves(numbers, target, answer_expression(completion)) else 0.0

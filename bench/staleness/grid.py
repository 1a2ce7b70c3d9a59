"""The sweep's grid and its results file: which runs make up the experiment, in what order they run, and the
JSON-lines file that holds every finished run (so a sweep resumes where it stopped)."""

from __future__ import annotations

import json
import typing
from dataclasses import asdict
from pathlib import Path

from dataplane.jobs import LossConfig

from .runs import SETUPS

SYNCHRONOUS = 0  # the reference: every record from the current policy
DEFAULT_CORRECTION = "behaviour"  # LossConfig's default; the synchronous cell runs with it
FIRST_BUDGETS = (SYNCHRONOUS, 6)  # run before the other budgets: the question is S = 6 against synchronous


def corrections_available() -> list[str]:
    """The off-policy corrections this checkout's learner implements (``LossConfig.off_policy``)."""
    return list(typing.get_args(LossConfig.model_fields["off_policy"].annotation))


def grid(tasks: list[str], budgets: list[int], corrections: list[str], seeds: list[int], steps: dict[str, int]
         ) -> list[dict]:
    """Every run of the sweep as ``{task, staleness, correction, seed, steps}``, in the order to run them: task by
    task; the synchronous reference and S = 6 first; then seed by seed, so a sweep stopped early has about as many
    seeds in every cell. The synchronous reference runs once per seed, with the default correction (at lag 0 the
    corrections differ only by rounding: the behaviour log-probs are the policy's)."""
    unknown = [c for c in corrections if c not in corrections_available()]
    if unknown:
        raise ValueError(f"corrections: {', '.join(unknown)} not implemented here; available: "
                         f"{', '.join(corrections_available())}")
    if any(s != SYNCHRONOUS and s < 2 for s in budgets):
        raise ValueError(f"staleness: a budget is 0 (synchronous) or >= 2 (kappa = S - 1 >= 1), got {budgets}")
    cells = [(s, DEFAULT_CORRECTION if s == SYNCHRONOUS else c) for s in budgets
             for c in ([DEFAULT_CORRECTION] if s == SYNCHRONOUS else corrections)]
    runs = [{"task": task, "staleness": s, "correction": c, "seed": seed, "steps": steps[task]}
            for task in tasks for seed in seeds for s, c in cells]
    return sorted(runs, key=lambda r: (tasks.index(r["task"]), r["staleness"] not in FIRST_BUDGETS, r["seed"],
                                       budgets.index(r["staleness"]), cells.index((r["staleness"], r["correction"]))))


def run_key(run: dict) -> tuple:
    return run["task"], run["staleness"], run["correction"], run["seed"], run["steps"]


def load_results(path: Path) -> tuple[list[dict], int]:
    """The finished runs in ``path`` whose setup is today's (a run of an older setup is another experiment), and
    how many lines were skipped (unreadable, e.g. cut by a kill, or of another setup)."""
    if not path.exists():
        return [], 0
    kept, skipped = [], 0
    for line in path.read_text().splitlines():
        try:
            result = json.loads(line)
            current = SETUPS[result["task"]]
            if result["setup"] != asdict(current):
                raise ValueError("another setup")
        except (ValueError, KeyError, TypeError):
            skipped += 1
            continue
        kept.append(result)
    return kept, skipped


def append_result(path: Path, result: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(result, separators=(",", ":")) + "\n")
        f.flush()

"""What scoring the owner's reward functions on the learner costs (learner/scoring.py), against T_train.

Run: ``.venv/bin/python bench/bench_scoring.py [--records 512] [--group 16] [--chars 1200] [--processes 1 2]``

``--records`` completions of ``--chars`` characters (reasoning text ending in ``\\boxed{<answer>}``, right half the
time) of a math data set, in groups of ``--group``, are scored by each reward below as the learner scores them:
in process (``DatasetTask.owner_scores``, the floor: no pickling, one core) and through the learner's pool of
``--processes`` spawned processes (submitted all at once, as groups are read, and collected; the pool started and
warmed beforehand). The table gives milliseconds per record and the seconds a step of the paper's batch
(R = 128 prompts x n = 16 = 2048 records) would spend scoring, beside the paper's T_train for ECHO-2 on Qwen3-8B
(1631.2 s, section 5.2): the pool scores while the step trains, so scoring is free while it stays below T_train.
Rewards: ``math_verify`` (Hugging Face math-verify: parse the answer and the completion, compare), ``regex``
(``\\\\boxed\\{\\d+\\}`` searched), both scored on the learner (``scored_on = "learner"``).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.dataset import content  # noqa: E402
from dataplane.packed import pack_records  # noqa: E402
from dataplane.records import Trajectory  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from learner.scoring import OwnerScoring  # noqa: E402

PAPER_R, PAPER_T_TRAIN = 128 * 16, 1631.2  # section 5.1 (batch 128, n 16) and 5.2 (ECHO-2, S=3, Qwen3-8B)
REWARDS = {
    "math_verify": {"function": "math_verify", "scored_on": "learner"},
    "regex": {"function": "regex", "options": {"pattern": r"\\boxed\{\d+\}"}, "scored_on": "learner"},
}


def data_set(directory: Path, rows: int) -> tuple[Path, list[tuple[str, str]]]:
    rng = random.Random(0)
    pairs = [(f"What is {a} * {b}? Put the answer in \\boxed{{}}.", str(a * b))
             for a, b in ((rng.randint(10, 999), rng.randint(10, 999)) for _ in range(rows))]
    path = directory / "math.jsonl"
    path.write_text("".join(json.dumps({"prompt": q, "answer": a}) + "\n" for q, a in pairs))
    return path, pairs


def completion(answer: str, right: bool, chars: int) -> str:
    reasoning = "Let me multiply step by step, carrying the tens and checking each partial product. "
    given = answer if right else str(int(answer) + 1)
    return (reasoning * (chars // len(reasoning) + 1))[:chars] + f" So the result is \\boxed{{{given}}}."


def groups_of(pairs: list[tuple[str, str]], *, records: int, group: int, chars: int) -> list[SimpleNamespace]:
    out = []
    for g in range(records // group):
        prompt, answer = pairs[g % len(pairs)]
        recs = [Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt=prompt, prompt_ids=[1, 2],
                           completion=completion(answer, k % 2 == 0, chars), completion_ids=list(range(3, 3 + 8)),
                           logprobs=[-1.0] * 8, reward=0.0, version=0) for k in range(group)]
        out.append(SimpleNamespace(entry_id=f"{g}-0", packed=pack_records(recs)))
    return out


def in_process_ms(task, groups: list[SimpleNamespace]) -> float:
    started = time.perf_counter()
    for g in groups:
        task.owner_scores(list(g.packed.prompts), list(g.packed.completions), completion_ids=[[]] * len(g.packed),
                          trainer_state=None, chat=None)
    return (time.perf_counter() - started) * 1000 / sum(len(g.packed) for g in groups)


def pool_ms(spec: dict, groups: list[SimpleNamespace], processes: int) -> float:
    scoring = OwnerScoring(spec, chat=None, max_steps=10, processes=processes)
    try:
        assert scoring.preflight() == ""  # every process started and warm (math-verify imported) before timing
        for _ in range(processes):
            scoring.apply(groups[:1], 0)
            scoring.pending.clear()
        for g in groups:
            g.packed.worker_rewards = None
        started = time.perf_counter()
        scoring.submit(groups, 0)
        scores = scoring.apply(groups, 0)
        elapsed = time.perf_counter() - started
        assert scores.errors == 0 and scores.non_finite == 0, scores
    finally:
        scoring.close()
    return elapsed * 1000 / sum(len(g.packed) for g in groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=512)
    parser.add_argument("--group", type=int, default=16)
    parser.add_argument("--chars", type=int, default=1200)
    parser.add_argument("--processes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    table = Table("reward", "where", "ms / record", f"s per paper step (R={PAPER_R})", "/ T_train (1631.2 s)",
                  title=f"Scoring on the learner: {args.records} records of {args.chars} chars, groups of {args.group}")
    with tempfile.TemporaryDirectory() as tmp:
        path, pairs = data_set(Path(tmp), 256)
        digest = content.digest(path)
        content.register(digest, path)
        groups = groups_of(pairs, records=args.records, group=args.group, chars=args.chars)
        for name, reward in REWARDS.items():
            spec = {"name": "dataset", "reward": [reward], "data": {"digest": digest, "format": "jsonl"}}
            task = build_task(spec)
            in_process_ms(task, groups[:1])  # warm: math-verify's parsers built on first use
            rows = [("in process (1 core)",
                     statistics.median(in_process_ms(task, groups) for _ in range(args.repeats)))]
            rows += [(f"pool of {p}", statistics.median(pool_ms(spec, groups, p) for _ in range(args.repeats)))
                     for p in args.processes]
            for where, ms in rows:
                per_step = ms * PAPER_R / 1000
                table.add_row(name, where, f"{ms:.3f}", f"{per_step:.2f}", f"{per_step / PAPER_T_TRAIN:.5f}")
    Console().print(table)


if __name__ == "__main__":
    main()

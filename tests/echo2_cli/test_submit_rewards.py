"""``echo2 job submit --dry-run`` calls the owner's reward functions on a few rows of the job file's data set, as the
job's learner does before step 1: the example's passes, a raising one and one returning words are refused with the
reason (the traceback's end), exit code 2, before anything is sent."""

from __future__ import annotations

from pathlib import Path

import pytest

from .test_cli import echo2

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "jobs" / "dataset-parquet.toml"

pytest.importorskip("datasets")


def test_the_examples_reward_passes_the_dry_run() -> None:
    done = echo2("job", "submit", str(EXAMPLE), "--dry-run")
    assert done.returncode == 0, done.stderr
    assert 'function = "examples.rewards.sums_rewards:correct"' in done.stdout


@pytest.mark.parametrize(("function", "says"), [("broken", "ZeroDivisionError: division by zero"),
                                                ("worded", "returned 'good' (str), not a number")])
def test_a_reward_that_cannot_score_is_refused_before_anything_is_sent(tmp_path, function, says) -> None:
    job = tmp_path / "job.toml"
    text = EXAMPLE.read_text().replace("examples.rewards.sums_rewards:correct", f"tests.owner_rewards:{function}")
    job.write_text(text.replace('"../data/sums.parquet"', repr(str(ROOT / "examples" / "data" / "sums.parquet"))))
    done = echo2("job", "submit", str(job), "--dry-run", env={"ECHO2_SERVER": "http://127.0.0.1:9"})
    assert done.returncode == 2, done.stderr
    assert f"reward function tests.owner_rewards:{function}" in done.stderr and says in done.stderr, done.stderr

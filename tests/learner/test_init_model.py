"""``echo2-learner init-model`` for every task: a job file's task (its data set read where the file names it), a
task's name, and a task that needs options it was not given (printable ASCII, said on stderr)."""

from __future__ import annotations

import json
import string
from pathlib import Path

import pytest
from typer.testing import CliRunner

from learner import cli

ROOT = Path(__file__).resolve().parents[2]


def vocabulary(directory: Path) -> set[str]:
    return set(json.loads((directory / "tokenizer.json").read_text())["model"]["vocab"])


@pytest.mark.parametrize("job", ["reasoning-gym.toml", "dataset-parquet.toml", "arithmetic.toml"])
def test_a_job_file_gives_the_tokenizer_its_tasks_characters(tmp_path, job) -> None:
    pytest.importorskip("reasoning_gym")
    pytest.importorskip("datasets")
    job_file = ROOT / "examples" / "jobs" / job
    done = CliRunner().invoke(cli.app, ["init-model", str(tmp_path / "m"), "--task", str(job_file), "--hidden", "8",
                                        "--layers", "1"])
    assert done.exit_code == 0, done.output
    assert set("012345678+") <= vocabulary(tmp_path / "m")


def test_a_task_that_needs_options_gets_printable_ascii_and_an_unknown_one_fails(tmp_path) -> None:
    done = CliRunner().invoke(cli.app, ["init-model", str(tmp_path / "gym"), "--task", "reasoning_gym", "--hidden", "8",
                                        "--layers", "1"])
    assert done.exit_code == 0, done.output
    assert "needs its options" in done.output and set(string.printable) <= vocabulary(tmp_path / "gym")

    bad = CliRunner().invoke(cli.app, ["init-model", str(tmp_path / "x"), "--task", "nope"])
    assert bad.exit_code != 0 and "unknown task 'nope'" in bad.output


def test_the_examples_owner_code_imports_from_the_checkout_with_no_pythonpath(tmp_path) -> None:
    """As the example job files say: the commands run in the repository's root find the owner's modules
    (examples.envs.echo2_sums, examples.rewards.sums_rewards) with no PYTHONPATH set."""
    import os
    import subprocess
    import sys

    pytest.importorskip("verifiers")
    pytest.importorskip("datasets")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("ECHO2_")}
    learner = Path(sys.executable).parent / "echo2-learner"
    done = subprocess.run([str(learner), "init-model", str(tmp_path / "m"), "--task", "examples/jobs/verifiers.toml",
                           "--hidden", "8", "--layers", "1"], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert set("01234+=") <= vocabulary(tmp_path / "m")
    echo2 = Path(sys.executable).parent / "echo2"
    dry = subprocess.run([str(echo2), "job", "submit", "examples/jobs/dataset-parquet.toml", "--dry-run"], cwd=ROOT,
                         env=env, capture_output=True, text=True, timeout=120)
    assert dry.returncode == 0, dry.stderr

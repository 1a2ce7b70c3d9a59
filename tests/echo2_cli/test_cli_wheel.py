"""The owner's CLI alone (packaging/echo2-cli): its wheel, built by scripts/build-wheel.sh as `make` does, installs
into a fresh virtualenv without torch or numpy, and there `echo2 --help`, a job file's check and `echo2 login`
against a live site work."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from ..marketplace import factories
from .test_cli import JOB

ROOT = Path(__file__).resolve().parents[2]


def run(*cmd: str | Path, env: dict[str, str] | None = None, **kwargs) -> subprocess.CompletedProcess:
    done = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, timeout=300,
                          env=(os.environ | (env or {})), **kwargs)
    assert done.returncode == 0, (cmd, done.stdout[-2000:], done.stderr[-2000:])
    return done


@pytest.mark.django_db(transaction=True)
def test_the_cli_wheel_installs_without_torch_and_logs_in(live_server, tmp_path) -> None:
    dist = tmp_path / "dist"
    run(ROOT / "scripts" / "build-wheel.sh", dist, env={"PYTHON": sys.executable}, cwd=ROOT)
    [wheel] = dist.glob("echo2_cli-*-py3-none-any.whl")
    venv = tmp_path / "venv"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "-q", wheel)

    installed = {line.split("==")[0].lower() for line in run(venv / "bin" / "pip", "freeze").stdout.split()}
    assert "echo2-cli" in installed and not installed & {"torch", "numpy", "transformers", "django"}, installed
    env = {k: v for k, v in os.environ.items() if not k.startswith("ECHO2_") and k != "PYTHONPATH"}
    env |= {"XDG_CONFIG_HOME": str(tmp_path / "config")}
    echo2 = venv / "bin" / "echo2"
    outside = {"cwd": tmp_path, "env": env}  # not the checkout: the installed package, not the sources
    assert "login" in run(echo2, "--help", **outside).stdout
    assert help_cost(venv, echo2, outside) < 15  # 32x before its imports were deferred (1.97 s), 9x after (0.40 s)

    (tmp_path / "job.toml").write_text(JOB.format(model_dir=tmp_path))
    assert 'name = "arithmetic"' in run(echo2, "job", "submit", tmp_path / "job.toml", "--dry-run", **outside).stdout

    token = factories.token(factories.user("owner"))
    run(echo2, "login", "--server", live_server.url, input=token + "\n", **outside)
    assert json.loads(run(echo2, "job", "list", "--json", **outside).stdout) == []


HEAVY = ("pydantic", "httpx", "rich", "yaml", "dataplane.jobs", "dataplane.tasks", "dataplane.dataset.content")
"""Modules `echo2 --help` has no use for: the job spec, the site client and the terminal tables load with a command."""


def help_cost(venv: Path, echo2: Path, outside: dict) -> float:
    """`echo2 --help` in the fresh venv, as a multiple of starting its Python (`python -c pass`): the best of 5 of
    each, interleaved, so a busy machine slows both alike. Also checks that it imports none of :data:`HEAVY`."""
    loaded = run(venv / "bin" / "python", "-X", "importtime", "-m", "echo2_cli", "--help", **outside).stderr
    names = {line.rsplit("|", 1)[-1].strip() for line in loaded.splitlines() if line.startswith("import time:")}
    assert not names & set(HEAVY), names & set(HEAVY)
    best = {"pass": float("inf"), "help": float("inf")}
    for _ in range(5):
        for key, cmd in (("pass", [venv / "bin" / "python", "-c", "pass"]), ("help", [echo2, "--help"])):
            start = time.perf_counter()
            run(*cmd, **outside)
            best[key] = min(best[key], time.perf_counter() - start)
    return best["help"] / best["pass"]


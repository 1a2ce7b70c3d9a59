"""Two ``make demo`` (or ``make demo-real``) runs in one clone: the second refuses with a clear message and touches
nothing of the first (it once wiped the first's database, and their Celery beats shared a schedule file)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from echo2_site.demo import ROOT, claim_workdir


@pytest.mark.parametrize("module", ["echo2_site.demo", "echo2_site.demo_real"])
def test_a_second_demo_in_the_same_directory_refuses_and_leaves_the_first_alone(tmp_path, module: str) -> None:
    workdir = tmp_path / "demo"
    workdir.mkdir()
    (workdir / "echo2.sqlite3").write_text("the first demo's database")
    first = claim_workdir(workdir)  # this process plays the first demo
    assert not isinstance(first, str)
    try:
        second = subprocess.run([sys.executable, "-m", module, "--workdir", str(workdir)], cwd=ROOT,
                                capture_output=True, text=True, timeout=120)
        assert second.returncode == 1
        said = " ".join(second.stdout.split())  # as one line (the console wraps it)
        assert f"another demo (pid {os.getpid()}) is running in {workdir}: stop it first" in said
        assert (workdir / "echo2.sqlite3").read_text() == "the first demo's database"
    finally:
        first.close()
    again = claim_workdir(workdir)  # the first ended: the directory is free again
    assert not isinstance(again, str)
    again.close()

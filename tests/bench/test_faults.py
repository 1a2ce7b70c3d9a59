"""The fault suite's faults are one registry of objects (bench/faults/): every module of the folder is a fault,
docs/faults.md's table is theirs, and each injection only asks the bench's run for what it has."""

from __future__ import annotations

import pkgutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import faults  # noqa: E402
from faults import FAULTS, doc_table  # noqa: E402


def test_every_module_of_the_folder_is_a_registered_fault_and_none_comes_first() -> None:
    modules = {m.name for m in pkgutil.iter_modules(faults.__path__)} - {"base"}

    assert {type(f).__module__.rpartition(".")[2] for f in FAULTS.values()} == modules
    assert list(FAULTS)[0] == "none" and len(FAULTS) == len(modules) == 9
    assert all(f.about and f.does and (f.detect or f.name == "none") for f in FAULTS.values())


def test_the_docs_table_is_the_registry() -> None:
    assert doc_table() in (ROOT / "docs" / "faults.md").read_text()


def test_the_bench_lists_the_registry_without_starting_anything() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "bench" / "bench_faults.py"), "--list"], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == doc_table()


class Recorder:
    """Stands for bench_faults.Run: records what an injection calls, refuses what Run does not have."""

    def __init__(self, run_class: type) -> None:
        self.run_class, self.calls = run_class, []
        self.args = type("Args", (), {"outage": 60.0})()

    def __getattr__(self, name: str):
        if not callable(getattr(self.run_class, name, None)):
            raise AttributeError(f"Run has no method {name!r}")
        return lambda *args: self.calls.append((name, *args))


@pytest.mark.parametrize("name", list(FAULTS))
def test_each_injection_uses_only_what_the_run_offers(name: str) -> None:
    import bench_faults

    run = Recorder(bench_faults.Run)
    plan = FAULTS[name].plan(run, "agent-a")
    for delay, label, action in plan:
        assert delay >= 0 and label
        action()

    assert len(run.calls) == len(plan)
    assert (FAULTS[name].target == "") == (plan == [])  # only the baseline injects nothing

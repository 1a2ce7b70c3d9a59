"""``make demo`` stops every process it started on SIGTERM and SIGHUP, as on Ctrl-C (each child runs in a
session of its own, so a signal to the demo reaches none of them)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from echo2_site.demo import ROOT


def _default_signals() -> None:
    """In the child before exec: the signals this test sends act by default there, whatever the test's own process
    inherited (``nohup`` ignores SIGHUP, a shell's background job SIGINT; an ignored disposition survives exec)."""
    for signum in (signal.SIGHUP, signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, signal.SIG_DFL)


def _stop_recorded(pids_file: Path) -> None:
    """Finalizer, on failure too: kill what the demo or the stack recorded and still runs (each child leads a
    session of its own: its whole group goes)."""
    try:
        pids = json.loads(pids_file.read_text())
    except (OSError, ValueError):
        return
    for pid in pids.values():
        if isinstance(pid, int) and _alive(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.slow
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signal_stops_every_process_the_demo_started(tmp_path, signum) -> None:
    demo = subprocess.Popen([sys.executable, "-m", "echo2_site.demo", "--workdir", str(tmp_path)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, preexec_fn=_default_signals)
    pids_file = tmp_path / "pids.json"
    try:
        deadline = time.monotonic() + 120
        while not (pids_file.exists() and "daphne" in pids_file.read_text()):  # Redis and the site are up
            assert demo.poll() is None and time.monotonic() < deadline, demo.stdout.read()
            time.sleep(0.2)
        pids = json.loads(pids_file.read_text())
        demo.send_signal(signum)
        try:
            out, _ = demo.communicate(timeout=60)
        except subprocess.TimeoutExpired as late:
            masks = [line for line in Path(f"/proc/{demo.pid}/status").read_text().splitlines()
                     if line.startswith(("SigPnd", "ShdPnd", "SigBlk", "SigIgn", "SigCgt"))]
            text = late.output.decode(errors="replace") if isinstance(late.output, bytes) else late.output or ""
            pytest.fail(f"the demo did not stop in 60 s after {signum.name}; {masks}; its output:\n{text[-3000:]}")
    finally:
        if demo.poll() is None:
            demo.kill()
            demo.wait(10)
        _stop_recorded(pids_file)  # a failed stop must not leave daphne, Celery, agents and a redis-server behind
    assert demo.returncode == 128 + signum, out
    assert "all demo processes stopped" in out
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in pids.values()) and time.monotonic() < deadline:
        time.sleep(0.1)  # reparented to init, which reaps them
    assert not [name for name, pid in pids.items() if _alive(pid)]


def test_a_child_the_stack_did_not_record_is_found_for_the_stop() -> None:
    """A signal raised inside Popen after the fork leaves the child unrecorded; the stop finds it among the demo's
    children all the same (and never names a child the stack holds)."""
    from echo2_site.demo import _untracked_children

    child = subprocess.Popen(["sleep", "30"], start_new_session=True, preexec_fn=_default_signals)
    try:
        assert child.pid in _untracked_children(set())
        assert child.pid not in _untracked_children({child.pid})
    finally:
        child.kill()
        child.wait()
    assert child.pid not in _untracked_children(set())


PROGRAM = """
import sys, time
from pathlib import Path
from echo2_site.demo import Stack
stack = Stack(Path(sys.argv[1]), {})
stack.start("sleeper", "sleep", "600")
print("started", flush=True)
time.sleep(600)  # no try/finally of its own: a bench that dies before reaching one
"""


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_any_program_with_a_stack_stops_what_it_started_on_a_signal(tmp_path, signum) -> None:
    """Every bench and live test starts its processes through a Stack: a ``timeout`` or a closed terminal ends
    them too, even before the program reached its own ``finally`` (a bench's private redis-server once outlived
    it by 15 minutes)."""
    program = subprocess.Popen([sys.executable, "-c", PROGRAM, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, preexec_fn=_default_signals)
    try:
        assert program.stdout.readline().strip() == "started"
        child = json.loads((tmp_path / "pids.json").read_text())["sleeper"]
        assert _alive(child)
        program.send_signal(signum)
        program.wait(30)
        deadline = time.monotonic() + 15
        while _alive(child) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not _alive(child), f"the stack's child {child} outlived its program"
    finally:
        if program.poll() is None:
            program.kill()
            program.wait(10)
        _stop_recorded(tmp_path / "pids.json")

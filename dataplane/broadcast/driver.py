"""A harness's handle on one relay process (``python -m dataplane.broadcast.process``): its JSON-line events read
from stdout into a queue, its commands written to stdin. The relay tests, ``bench/bench_broadcast.py`` and the WAN
bench's data-plane run (``bench/wan/wire.py``, inside a network namespace through ``prefix``) all drive relays
through it; the agent and the learner run relays in their own event loops and never need it.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

MODULE = "dataplane.broadcast.process"


class RelayProcessError(RuntimeError):
    """A relay process (a test's, the bench's, the learner's origin) reported an error or refused a command,
    did not start, exited, or said nothing in time: the one error of the relays run as processes."""


class RelayProcess:
    """One relay process in a session of its own. ``prefix``: what runs Python (``[sys.executable]``, or a
    namespace's ``ip netns exec ... python``); ``log``: where its stderr and every event it prints go (None: stderr
    inherited, events kept only in :attr:`seen`)."""

    def __init__(self, args: Sequence[str], *, prefix: Sequence[str] = (sys.executable,), module: str = MODULE,
                 cwd: str | Path | None = None, env: dict[str, str] | None = None, log: Path | None = None,
                 name: str = "relay") -> None:
        self.name, self.log = name, log
        stderr = log.open("a") if log is not None else None
        try:
            self.proc = subprocess.Popen([*prefix, "-m", module, *args], cwd=cwd, env=env, text=True, bufsize=1,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr,
                                         start_new_session=True)
        finally:
            if stderr is not None:
                stderr.close()  # the child holds its own copy
        self.events: queue.Queue[dict[str, Any] | None] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        threading.Thread(target=self._pump, name=f"{name}-events", daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in self.proc.stdout:
                if self.log is not None:
                    with self.log.open("a") as f:
                        f.write(line)
                self.events.put(json.loads(line))
        finally:
            self.events.put(None)  # it exited (or printed what is not an event)

    def wait(self, kind: str, timeout: float = 30.0, when: Callable[[dict], bool] = lambda event: True) -> dict:
        """The first event of ``kind`` (that ``when`` accepts), among those seen already or arriving within
        ``timeout`` s. Raises :class:`RelayProcessError` on an ``error`` event (unless waiting for one), on exit and
        on timeout, naming what it saw."""
        for event in self.seen:
            if event["event"] == kind and when(event):
                return event
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                event = self.events.get(timeout=min(left, 0.5))
            except queue.Empty:
                continue
            if event is None:
                self.events.put(None)  # stays exited for the next wait
                raise RelayProcessError(self._why(f"exited (code {self.proc.poll()}) before a {kind!r} event"))
            self.seen.append(event)
            if event["event"] == "error" and kind != "error":
                raise RelayProcessError(self._why(f"failed: {event.get('reason')}"))
            if event["event"] == kind and when(event):
                return event
        raise RelayProcessError(self._why(f"no {kind!r} event within {timeout:g} s"))

    def _why(self, what: str) -> str:
        where = f"; see {self.log}" if self.log is not None else ""
        return f"{self.name}: {what}; saw {[e['event'] for e in self.seen]}{where}"

    def send(self, **cmd: Any) -> None:
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()

    def stop(self, timeout: float = 5.0) -> None:
        """Ask it to exit (the ``exit`` command, then stdin's end); kill its session if it does not in time."""
        if self.proc.poll() is None:
            try:
                self.send(cmd="exit")
                self.proc.stdin.close()
                self.proc.wait(timeout)
                return
            except (OSError, subprocess.TimeoutExpired):
                pass
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(timeout)

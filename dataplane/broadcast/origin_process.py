"""The learner's handle on its relay hub's process (:mod:`dataplane.broadcast.origin`): starts it, tells it what to
serve, and keeps it running.

- **Commands** go to the child's stdin, each with an id; the call waits for the acknowledgement naming that id, at
  most ``ack_timeout`` seconds. Only the versions' numbers cross the pipe: the child reads each version from the
  store's directory. The job's secret goes on stdin too, never on argv or in the environment.
- **What it serves** is kept here (the secret, the plan's number of chains, the versions served and not pruned),
  so a new child is told all of it.
- **A child that dies** (or does not answer a command in time: killed by pid) is restarted on the same port, the
  advertised address agents dial, and serves the same versions again; the learner's log gets one line. A call that
  finds it dead restarts it at once; otherwise the thread reading its stdout does, retrying with backoff.
- **The child's stderr is the learner's**: its log lines (a refused credential) land in the learner's log. It
  stays in the learner's process group; it exits on stdin's end, so a learner killed even with SIGKILL leaves
  no relay behind. :meth:`OriginProcess.stop` asks it to exit, then kills it by pid.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import subprocess
import sys
import threading
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

from .driver import RelayProcessError
from .store import MANIFEST, version_dir

log = logging.getLogger("echo2.learner")

MODULE = "dataplane.broadcast.origin"
READ_FLOOR_BPS = 50e6
"""A ``serve`` is acknowledged once the child has read the version from disk: its wait is ``ack_timeout`` plus the
version's bytes at this rate (a slow disk), so a base of several GB is not taken for a hung child."""


class _Gone(Exception):
    """The child exited (or stopped answering and was killed) before acknowledging."""


class _Child:
    """One relay process: its stdout read on a thread, acknowledgements handed to the command that waits for them."""

    def __init__(self, argv: list[str], on_exit) -> None:
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=None, text=True,
                                     bufsize=1)
        self.pid, self.port = self.proc.pid, None
        self.settled, self.gone = threading.Event(), threading.Event()  # settled: listening, or gone
        self.start_error: str | None = None
        self._acks: dict[int, list] = {}  # id -> [threading.Event, reply]
        self._ids, self._write = itertools.count(1), threading.Lock()
        self._on_exit = on_exit
        threading.Thread(target=self._pump, name=f"learner-relay-{self.pid}", daemon=True).start()

    def _pump(self) -> None:
        try:
            for line in self.proc.stdout:
                try:
                    event = json.loads(line)
                except json.JSONDecodeError:
                    log.warning("learner relay (pid %d) printed %r", self.pid, line[:200])
                    continue
                self._take(event)
        finally:
            self.gone.set()
            self.settled.set()
            for waiter in list(self._acks.values()):
                waiter[0].set()  # no reply: gone
            self._on_exit(self)

    def _take(self, event: dict[str, Any]) -> None:
        if event.get("event") == "listening":
            self.port = event.get("port")
            self.settled.set()
        elif (waiter := self._acks.get(event.get("id"))) is not None:
            waiter[1] = event
            waiter[0].set()
        elif event.get("event") == "error":
            self.start_error = str(event.get("reason"))
            log.warning("learner relay (pid %d): %s", self.pid, self.start_error)

    def ask(self, cmd: dict[str, Any], timeout: float) -> dict[str, Any]:
        """Send ``cmd``; its acknowledgement. Raises :class:`_Gone` if the child exits first or says nothing within
        ``timeout`` s (then it is killed: a hung hub is a dead one), RelayProcessError on its refusal."""
        waiter: list = [threading.Event(), None]
        with self._write:
            ident = next(self._ids)
            self._acks[ident] = waiter
            try:
                self.proc.stdin.write(json.dumps({**cmd, "id": ident}) + "\n")
                self.proc.stdin.flush()
            except (OSError, ValueError):  # a closed pipe
                self._acks.pop(ident, None)
                raise _Gone(f"pid {self.pid} exited (code {self.proc.poll()})") from None
        try:
            if not waiter[0].wait(timeout):
                log.warning("learner relay (pid %d) did not acknowledge %r within %g s: killing it", self.pid,
                            cmd.get("cmd"), timeout)
                self.kill(timeout)
                raise _Gone(f"pid {self.pid} did not answer within {timeout:g} s")
        finally:
            self._acks.pop(ident, None)
        reply = waiter[1]
        if reply is None:
            raise _Gone(f"pid {self.pid} exited (code {self.proc.poll()}) before acknowledging {cmd.get('cmd')!r}")
        if reply.get("event") == "error":
            raise RelayProcessError(f"learner relay: {reply.get('reason')}")
        return reply

    def kill(self, timeout: float) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout)

    def stop(self, timeout: float) -> None:
        """The ``exit`` command and stdin's end; killed by pid if still running after ``timeout`` s."""
        if self.proc.poll() is None:
            with contextlib.suppress(OSError, ValueError), self._write:
                self.proc.stdin.write('{"cmd": "exit"}\n')
                self.proc.stdin.close()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                log.warning("learner relay (pid %d) did not exit within %g s: killing it", self.pid, timeout)
        self.kill(timeout)
        with contextlib.suppress(OSError, ValueError):
            self.proc.stdin.close()


class OriginProcess:
    """The relay hub in a child process (see the module); the interface of the in-thread hub of
    :class:`learner.serving.LearnerRelay`."""

    def __init__(self, root: Path, job_id: int, *, uplink_bps: float | None, host: str = "127.0.0.1", port: int = 0,
                 secret: str | None = None, start_timeout: float = 30.0, ack_timeout: float = 60.0) -> None:
        self.root, self.job_id, self.uplink_bps, self.host = Path(root), job_id, uplink_bps, host
        self.start_timeout, self.ack_timeout = start_timeout, ack_timeout
        self.secret, self.n_chains = secret, None
        self.served: set[int] = set()
        """The versions the child serves (a new one is told them all)."""
        self._sizes: dict[int, int] = {}  # bytes of each version served (_serve_timeout)
        self.restarts = 0
        self._lock, self._stopping = threading.Lock(), threading.Event()
        self._child: _Child | None = None
        self.port = port
        with self._locked():
            self._child = self._start()
        self.port = self._child.port  # a restarted child listens here again

    @property
    def pid(self) -> int | None:
        return self._child.pid if self._child is not None else None

    # ---- what the learner calls ---------------------------------------------------------------------------

    def serve(self, version: int, published: Collection[int]) -> None:
        published = set(published)
        with self._locked():
            self.served = {v for v in self.served if v in published} | {version}
            self._sizes = {v: n for v, n in self._sizes.items() if v in self.served}
            try:
                self._ask({"cmd": "serve", "version": version, "published": sorted(published)},
                          self._serve_timeout(version))
            except RelayProcessError:
                self.served.discard(version)
                raise
            if version not in self.served:  # a restart on the way found it unreadable (its warning says why)
                raise RelayProcessError(f"learner relay: v{version} could not be served")

    def set_secret(self, secret: str | None) -> None:
        with self._locked():
            self.secret = secret
            self._ask({"cmd": "secret", "secret": secret})

    def set_fan_out(self, version: int, n_chains: int) -> None:
        with self._locked():
            self.n_chains = n_chains
            self._ask({"cmd": "fan_out", "version": version, "n_chains": n_chains})

    def status(self) -> dict[str, Any]:
        with self._locked():
            return self._ask({"cmd": "status"}) or self._ask({"cmd": "status"})  # once more after a restart

    def stop(self, timeout: float = 5.0) -> None:
        self._stopping.set()
        with self._locked():
            child, self._child = self._child, None
        if child is not None:
            child.stop(timeout)

    # ---- the child --------------------------------------------------------------------------------------------

    def _serve_timeout(self, version: int) -> float:
        """How long a ``serve`` of ``version`` may take: ``ack_timeout`` plus its bytes read at READ_FLOOR_BPS (its
        manifest read once: a version never changes)."""
        if version not in self._sizes:
            try:
                self._sizes[version] = int(json.loads((version_dir(self.root, version) / MANIFEST).read_text())
                                           ["total_bytes"])
            except (OSError, ValueError, KeyError, TypeError):
                return self.ack_timeout  # not there (yet): the child will say what is wrong with it
        return self.ack_timeout + self._sizes[version] / READ_FLOOR_BPS

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        # Held at most for a start (start_timeout plus one acknowledgement per served version) or one command.
        busy = self.start_timeout + self.ack_timeout * 3 + sum(self._serve_timeout(v) for v in self.served)
        if not self._lock.acquire(timeout=busy):
            raise RelayProcessError("learner relay: busy restarting for too long")
        try:
            yield
        finally:
            self._lock.release()

    def _ask(self, cmd: dict[str, Any], timeout: float | None = None) -> dict[str, Any] | None:
        """Send ``cmd`` to the child (the lock held); ``timeout``: its acknowledgement's wait (``ack_timeout``). A child
        that is gone is restarted here and told everything, ``cmd``'s effect included (None then); if it cannot be,
        the thread that saw it go retries."""
        if self._stopping.is_set() or self._child is None:
            raise RelayProcessError("learner relay: stopped")
        try:
            return self._child.ask(cmd, timeout or self.ack_timeout)
        except _Gone as gone:
            log.warning("learner relay: %s; restarting it on port %s", gone, self.port)
        try:
            self._child = self._start()
            self.restarts += 1
        except RelayProcessError as err:
            log.error("%s; retrying in the background", err)
        return None

    def _start(self) -> _Child:
        """A new child listening on our port and told what to serve (the lock held)."""
        argv = [sys.executable, "-m", MODULE, "--root", str(self.root), "--job", str(self.job_id),
                "--host", self.host, "--port", str(self.port)]
        if self.uplink_bps is not None:
            argv += ["--uplink-bps", repr(float(self.uplink_bps))]
        child = _Child(argv, self._exited)
        if not child.settled.wait(self.start_timeout) or child.port is None:
            child.kill(5.0)
            why = child.start_error or (f"exited with code {child.proc.poll()}" if child.gone.is_set()
                                        else f"not listening within {self.start_timeout:g} s")
            raise RelayProcessError(f"learner relay on {self.host}:{self.port}: {why} (its log lines: the learner's)")
        try:
            self._tell(child)
        except _Gone as gone:
            child.kill(5.0)
            raise RelayProcessError(f"learner relay: {gone} while being told what to serve") from None
        return child

    def _tell(self, child: _Child) -> None:
        """Everything a new child must know: the secret, the plan's fan-out, the versions served."""
        child.ask({"cmd": "secret", "secret": self.secret}, self.ack_timeout)
        if self.n_chains is not None:
            child.ask({"cmd": "fan_out", "version": -1, "n_chains": self.n_chains}, self.ack_timeout)
        for version in sorted(self.served):
            try:
                child.ask({"cmd": "serve", "version": version, "published": sorted(self.served)},
                          self._serve_timeout(version))
            except RelayProcessError as err:  # pruned meanwhile: nothing to serve
                log.warning("%s; v%d is no longer served", err, version)
                self.served.discard(version)

    def _exited(self, child: _Child) -> None:
        """On ``child``'s stdout thread, once it exited: if it is the one serving, restart it (with backoff)."""
        delay = 0.5
        while not self._stopping.is_set():
            try:
                with self._locked():
                    if child is not self._child:
                        return  # stopped by us, or restarted already
                    if delay == 0.5:
                        with contextlib.suppress(subprocess.TimeoutExpired):
                            child.proc.wait(5.0)
                        log.warning("learner relay (pid %d) exited with code %s; restarting it on port %s",
                                    child.pid, child.proc.poll(), self.port)
                    self._child = self._start()
                    self.restarts += 1
                    return
            except RelayProcessError as err:
                log.error("%s; again in %g s", err, delay)
            self._stopping.wait(delay)
            delay = min(delay * 2, 30.0)


"""The agent's relays run by a child process (``--relay-mode process``, the default): :class:`ProcessRelays` has the
interface the agent uses of :class:`~worker_agent.relaying.Relays` and drives ``python -m worker_agent.relay_child``,
which runs that same class on its own event loop (docs/agent.md "The relay process").

Why: a relay's event loop in the process that generates waits for the GIL on every piece it forwards; on the WAN
bench a generation-like thread in the relay's process cost the broadcast +0.70 x M/Bw, the same demand in another
process +0.18 (docs/wan.md "Where the time goes at N = 8").

The pipe is the child's stdin and stdout, JSON lines: the child learns of the agent's end by stdin's end (even a
SIGKILL), as :mod:`dataplane.broadcast.process` does, with no extra channel; the lines are small, for payloads cross
in files of ``work_dir`` (a received version: the child writes it, the agent checks the whole against the manifest's
digest, then deletes it). The child holds the relayed chunks (to serve our chain child), the agent its install copy.

A child that exits or falls silent fails the receives in flight at once (the install's failure path fetches again);
the agent logs one line and starts another, listening on the same port.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import shutil
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import websockets

from dataplane import messages as m
from dataplane.broadcast.relay import RelayStats, RelayTimeouts
from dataplane.snapshot import Manifest, parse_manifest

from .relay_files import clear_stale, read_payload, write_held

log = logging.getLogger("echo2.agent")

MODULE = "worker_agent.relay_child"
START_S = 30.0  # the child's hub listening, or its first sign of life
SILENT_S = 15.0  # a child that said nothing this long (it says "alive" every second) is taken as hung and killed
STOP_S = 5.0  # an exit command's grace before the child is killed
NEWS_MARGIN_S = 60.0  # a receive that heard nothing of its version for the relay's give_up plus this fails
RESTART_DELAYS = (0.0, 1.0, 2.0, 5.0, 10.0, 30.0)  # before each new child after deaths in a row


class RelayChildError(RuntimeError):
    """The relay process failed a receive, exited, or said nothing in time."""


@dataclass
class RelayView:
    """What the agent knows of one of the child's relays, as its events tell."""

    key: tuple[int, int]
    manifest: Manifest
    chunks: set[int] = field(default_factory=set)
    complete: bool = False
    serving: bool = False
    stats: RelayStats = field(default_factory=RelayStats)
    news: float = field(default_factory=time.monotonic)  # when the child last said something of it

    @property
    def have(self) -> list[int]:
        return sorted(self.chunks)


class ChildHub:
    """The child's relay hub: where it listens. ``close()`` stops listening as a hub's does, by ending the child
    (its relays with it); the next receive or ``start_hub`` starts another."""

    def __init__(self, relays: ProcessRelays, pid: int, port: int) -> None:
        self.relays, self.pid, self.port = relays, pid, port

    async def close(self) -> None:
        if self.relays.hub is self:
            await self.relays.stop_child()


class ProcessRelays:
    """The agent's relays, run by a child process. ``work_dir``: where payloads cross (the agent's cache's), in a
    directory of this agent's own (``agent-<pid>-<random>``), removed on :meth:`close`."""

    def __init__(self, *, worker_id: int, bandwidth_bps: float | None, listen: str | None,
                 report: Callable[[m._Msg], Awaitable[None]], work_dir: Path, debug: bool = False) -> None:
        self.worker_id, self.bandwidth_bps, self.listen, self.report = worker_id, bandwidth_bps, listen, report
        # ours alone: agents sharing a cache (one user's, one machine's) never meet on a file name
        self.work_dir, self.debug = Path(work_dir) / f"agent-{os.getpid()}-{uuid.uuid4().hex[:8]}", debug
        self.relays: dict[tuple[int, int], RelayView] = {}
        self.hub: ChildHub | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.deaths = 0  # children that exited unasked, in a row
        self._pending: dict[int, tuple[tuple[int, int], asyncio.Future]] = {}
        self._hub_wait: asyncio.Future | None = None
        self._ids = itertools.count(1)
        self._starting: asyncio.Lock | None = None
        self._tasks: set[asyncio.Task] = set()
        self._closed = False

    # ---- what the agent reads --------------------------------------------------------------------

    def __contains__(self, key: tuple[int, int]) -> bool:
        return key in self.relays

    def get(self, key: tuple[int, int]) -> RelayView | None:
        return self.relays.get(key)

    def busy(self) -> bool:
        """Whether a relay of ours is receiving a version or serving a child now (as the child last said)."""
        return any(not r.complete or r.serving for r in self.relays.values())

    # ---- the child -------------------------------------------------------------------------------

    async def _ensure(self) -> asyncio.subprocess.Process:
        if self._closed:
            raise RelayChildError("the agent's relays are closed")
        self._starting = self._starting or asyncio.Lock()
        async with self._starting:
            if self.proc is None or self.proc.returncode is not None:
                await self._spawn()
        return self.proc

    async def _spawn(self) -> None:
        if not self.work_dir.exists():
            await asyncio.to_thread(clear_stale, self.work_dir.parent)
            self.work_dir.mkdir(parents=True, exist_ok=True)
        args = ["--worker-id", str(self.worker_id), "--work-dir", str(self.work_dir)]
        args += ["--bandwidth-bps", str(self.bandwidth_bps)] if self.bandwidth_bps else []
        args += ["--listen", self.listen] if self.listen else []
        args += ["--debug"] if self.debug else []
        # the agent's process group and session (a kill of the group ends both, CPU is counted with the agent's);
        # it ignores the terminal's Ctrl-C: the agent stops it
        self.proc = proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", MODULE, *args, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            limit=2**20)
        self._watch(self._read(proc), f"the relay process {proc.pid}'s events")
        log.debug("relay process %d started", proc.pid)

    def _watch(self, coro, name: str) -> asyncio.Task:
        task = asyncio.get_running_loop().create_task(coro, name=name)
        self._tasks.add(task)

        def done(task: asyncio.Task) -> None:
            self._tasks.discard(task)
            if not task.cancelled() and task.exception() is not None:
                log.error("%s stopped: %r", task.get_name(), task.exception())
        task.add_done_callback(done)
        return task

    def _send(self, **cmd: Any) -> bool:
        """Write a command to the child; False when there is none to hear it."""
        proc = self.proc
        if proc is None or proc.returncode is not None or proc.stdin.is_closing():
            return False
        proc.stdin.write((json.dumps(cmd) + "\n").encode())
        return True

    async def _read(self, proc: asyncio.subprocess.Process) -> None:
        """The child's events until it exits, or falls silent (then it is killed); then its death is handled."""
        why = None
        while True:
            try:
                line = await asyncio.wait_for(proc.stdout.readline(), SILENT_S)
            except TimeoutError:
                why = f"said nothing for {SILENT_S:g} s"
                _kill(proc.pid)
                break
            except ValueError as err:  # a line over the limit: not ours
                why = f"wrote what is not an event ({err})"
                _kill(proc.pid)
                break
            if not line:
                break
            try:
                self._event(json.loads(line))
            except (ValueError, KeyError, TypeError) as err:
                log.warning("relay process %d: unreadable event %r: %s", proc.pid, line[:200], err)
        try:
            code = await asyncio.wait_for(proc.wait(), STOP_S)
        except TimeoutError:
            _kill(proc.pid)
            code = await asyncio.wait_for(proc.wait(), STOP_S)
        if self.proc is proc and not self._closed:
            self._died(proc, why or f"exited with code {code}")

    def _died(self, proc: asyncio.subprocess.Process, why: str) -> None:
        """The child is gone unasked: its receives fail at once, its relays are forgotten, another one starts."""
        reason = f"the relay process (pid {proc.pid}) {why}"
        pending = len(self._pending)
        log.error("%s; %d receive(s) in flight fail, starting a new one", reason, pending)
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(RelayChildError(reason))
        self._pending.clear()
        if self._hub_wait is not None and not self._hub_wait.done():
            self._hub_wait.set_exception(RelayChildError(reason))
        self.relays.clear()
        self.proc, self.hub = None, None
        self.deaths += 1
        self._watch(self._restart(RESTART_DELAYS[min(self.deaths - 1, len(RESTART_DELAYS) - 1)]), "relay restart")

    async def _restart(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if self._closed or self.proc is not None:
            return
        await self._ensure()
        if self.listen:  # our chain children dial this port: listen on it again
            self._send(cmd="start_hub")

    def _event(self, event: dict[str, Any]) -> None:
        kind = event["event"]
        if kind == "alive":
            return
        if kind in ("listening", "hub_failed"):
            if kind == "listening":
                self.hub = ChildHub(self, pid=self.proc.pid if self.proc else 0, port=int(event["port"]))
                self.deaths = 0
            if self._hub_wait is not None and not self._hub_wait.done():
                self._hub_wait.set_result(event)
            return
        if kind == "report":
            self._watch(self._report(m.RelayFailed.model_validate(event["message"])), "a relay failure report")
            return
        if kind == "error":
            log.error("relay process: %s", event.get("reason"))
            return
        key = (int(event["key"][0]), int(event["key"][1]))
        view = self.relays.get(key)
        if view is not None:
            view.news = time.monotonic()
            if "stats" in event and event["stats"]:
                view.stats = RelayStats(**event["stats"])
        if kind == "state" and view is not None:
            view.chunks.update(event["new"])
            view.complete, view.serving = bool(event["complete"]), bool(event["serving"])
        elif kind in ("received", "failed"):
            self.deaths = 0 if kind == "received" else self.deaths  # it works: a later death restarts at once
            _, future = self._pending.pop(int(event["id"]), (None, None))
            if future is not None and not future.done():
                future.set_result(event)

    async def _report(self, message: m.RelayFailed) -> None:
        with contextlib.suppress(ConnectionError, websockets.WebSocketException):
            await self.report(message)

    # ---- what the agent does ---------------------------------------------------------------------

    async def start_hub(self) -> None:
        """Have the child listen on ``listen`` (no-op without one); raises OSError when it cannot."""
        if not self.listen or self.hub is not None:
            return
        await self._ensure()
        if self._hub_wait is None or self._hub_wait.done():
            self._hub_wait = asyncio.get_running_loop().create_future()
            self._send(cmd="start_hub")
        try:
            event = await asyncio.wait_for(asyncio.shield(self._hub_wait), START_S)
        except TimeoutError:
            raise RelayChildError(f"the relay process did not listen on {self.listen} within {START_S:g} s") from None
        if event["event"] == "hub_failed":
            raise OSError(event["reason"])
        log.info("relay listening on %s (relay process %d)", self.listen, self.hub.pid if self.hub else 0)

    async def receive(self, snap: m.SnapshotAvailable, chunks: dict[int, bytes] | None = None, *,
                      timeouts: RelayTimeouts | None = None) -> tuple[Manifest, list[bytes], str]:
        """As :meth:`Relays.receive`: the child pulls the version (forwarding to our child) and writes it to a file;
        returns (manifest, the chunks in order, the whole checked against the manifest's digest, source)."""
        manifest = parse_manifest(snap.manifest)
        key, request = (snap.job_id, snap.version), next(self._ids)
        await self._ensure()
        held = self.work_dir / f"held-{request}" if chunks else None
        try:
            if held is not None:
                await asyncio.to_thread(write_held, held, manifest, chunks)
            view = self.relays[key] = RelayView(key, manifest)
            future = asyncio.get_running_loop().create_future()
            self._pending[request] = (key, future)
            if not self._send(cmd="receive", id=request, snap=snap.model_dump(mode="json"),
                              held=str(held) if held else None, held_indices=sorted(chunks or ()),
                              timeouts=asdict(timeouts) if timeouts else None):
                self._pending.pop(request, None)
                raise RelayChildError("the relay process is gone")
            event = await self._outcome(future, view, timeouts or RelayTimeouts())
        except asyncio.CancelledError:
            self._pending.pop(request, None)
            self.drop(key)
            raise
        finally:
            if held is not None:
                held.unlink(missing_ok=True)
        if event["event"] == "failed":
            raise RelayChildError(f"v{snap.version} of job {snap.job_id}: {event.get('reason')}")
        ordered = await asyncio.to_thread(read_payload, Path(event["path"]), manifest)
        view.complete = True
        stats = view.stats
        source = "parent" if stats.from_parent and stats.from_parent >= stats.from_fallback else "fallback"
        return manifest, ordered, source

    async def _outcome(self, future: asyncio.Future, view: RelayView, timeouts: RelayTimeouts) -> dict[str, Any]:
        """The child's ``received`` or ``failed`` for ``view``; fails after give_up + a margin without news of it."""
        limit = timeouts.give_up + NEWS_MARGIN_S
        while True:
            done, _ = await asyncio.wait({future}, timeout=1.0)
            if done:
                return future.result()
            if time.monotonic() - view.news > limit:
                raise RelayChildError(f"v{view.key[1]} of job {view.key[0]}: no news from the relay process in "
                                      f"{limit:g} s")

    def reroute(self, relay: RelayView | tuple[int, int] | None, snap: m.SnapshotAvailable) -> None:
        """Our place in the chain for ``snap``'s version, as the site routes it now (a publication or a repair)."""
        if relay is not None:
            self._send(cmd="reroute", snap=snap.model_dump(mode="json"))

    def retire(self, job_id: int, *, keep_from: int) -> None:
        for key in [k for k in self.relays if k[0] == job_id and k[1] < keep_from]:
            self.relays.pop(key)
        self._send(cmd="retire", job=job_id, keep_from=keep_from)

    def drop_other_jobs(self, job_id: int) -> None:
        for key in [k for k in self.relays if k[0] != job_id]:
            self.relays.pop(key)
        self._send(cmd="drop_other_jobs", job=job_id)

    def drop(self, key: tuple[int, int]) -> None:
        self.relays.pop(key, None)
        self._send(cmd="drop", key=list(key))

    async def close(self) -> None:
        """Stop the child for good (the agent is shutting down)."""
        self._closed = True
        for task in list(self._tasks):
            if task.get_name() == "relay restart":
                task.cancel()
        await self.stop_child()

        shutil.rmtree(self.work_dir, ignore_errors=True)

    async def stop_child(self) -> None:
        """End the child: the exit command and stdin's end, then SIGKILL (by its pid) if it lingers. Receives in
        flight fail; its relays are forgotten."""
        proc, self.proc, self.hub = self.proc, None, None  # its end is no death: no new child
        for _, future in self._pending.values():
            if not future.done():
                future.set_exception(RelayChildError("the relay process was stopped"))
        self._pending.clear()
        self.relays.clear()
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(OSError, RuntimeError):
            proc.stdin.write(b'{"cmd": "exit"}\n')
            proc.stdin.close()
        try:
            await asyncio.wait_for(proc.wait(), STOP_S)
        except TimeoutError:
            _kill(proc.pid)
            await asyncio.wait_for(proc.wait(), STOP_S)


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)


RELAY_MODES = ("process", "inline")
MODE_ENV = "ECHO2_RELAY_MODE"


def relay_mode(chosen: str | None = None) -> str:
    """The relay mode: ``chosen`` (the flag or the config's), else $ECHO2_RELAY_MODE, else ``inline`` (docs/agent.md
    "The relay process": on the WAN bench the child cost more than it saved)."""
    mode = chosen or os.environ.get(MODE_ENV) or "inline"
    if mode not in RELAY_MODES:
        raise ValueError(f"relay mode: expected one of {', '.join(RELAY_MODES)}, got {mode!r}")
    return mode

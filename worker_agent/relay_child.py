"""The agent's relays in a process of their own: ``python -m worker_agent.relay_child``, started and driven by
:class:`worker_agent.relay_process.ProcessRelays` (docs/agent.md "The relay process").

It runs the agent's :class:`~worker_agent.relaying.Relays` (the hub and one SnapshotRelay per version) on its own
event loop, so no generation thread of the agent makes that loop wait for the GIL on every piece it forwards
(docs/wan.md "Where the time goes at N = 8"). Commands come as JSON lines on stdin, events go as JSON lines to
stdout, logs to stderr (the agent's). Payloads never cross the pipe: a received version is written to a file of
``--work-dir`` that the agent reads, verifies and deletes; held chunks come the same way.

Commands: ``start_hub``; ``receive`` (id, snap: the SnapshotAvailable, held: path of a file with the held chunks at
their offsets, held_indices, timeouts: RelayTimeouts' fields); ``reroute`` (snap); ``retire`` (job, keep_from);
``drop`` (key); ``drop_other_jobs`` (job); ``exit``. Stdin's end (the agent exited, even by SIGKILL) exits too.

Events: ``listening`` (port) or ``hub_failed`` (reason); ``received`` (id, key, path, source, stats) or ``failed``
(id, key, reason); ``state`` (key, new: chunk indices verified since the last, complete, serving, stats) whenever a
relay's changes; ``report`` (message: a RelayFailed for the site); ``alive`` every second; ``error`` (reason) for a
command it could not read.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import sys
from dataclasses import asdict
from pathlib import Path
from typing import Any

from dataplane import messages as m
from dataplane.broadcast.relay import RelayTimeouts
from dataplane.snapshot import parse_manifest

from .relay_files import payload_name, read_held, write_payload
from .relaying import Relays

log = logging.getLogger("echo2.agent")

STATE_EVERY_S = 0.05  # how often the relays' state is compared with what the agent was last told
ALIVE_EVERY_S = 1.0  # the agent takes a child silent for ProcessRelays.SILENT_S as hung
MAX_LINE = 64 * 2**20  # a command line (a manifest of many chunks) may be long


class RelayChild:
    def __init__(self, args: argparse.Namespace, out: asyncio.WriteTransport) -> None:
        self.relays = Relays(worker_id=args.worker_id, bandwidth_bps=args.bandwidth_bps, listen=args.listen,
                             report=self._report)
        self.work_dir: Path = args.work_dir
        self.out = out
        self.receiving: dict[tuple[int, int], asyncio.Task] = {}
        self.told: dict[tuple[int, int], dict[str, Any]] = {}  # key -> the state last sent
        self.announced = False  # the hub's port sent

    def emit(self, event: str, **fields: Any) -> None:
        if not self.out.is_closing():
            self.out.write((json.dumps({"event": event, **fields}) + "\n").encode())

    async def _report(self, message: m._Msg) -> None:
        self.emit("report", message=message.model_dump(mode="json"))

    # ---- commands ------------------------------------------------------------------------------

    async def command(self, cmd: dict[str, Any]) -> bool:
        """Run one command; False: exit."""
        match cmd.get("cmd"):
            case "start_hub":
                try:
                    await self.relays.start_hub()
                except OSError as err:
                    self.emit("hub_failed", reason=f"cannot listen on {self.relays.listen}: {err}")
                    return True
                self._announce()
            case "receive":
                snap = m.SnapshotAvailable.model_validate(cmd["snap"])
                timeouts = RelayTimeouts(**cmd["timeouts"]) if cmd.get("timeouts") else None
                key = (snap.job_id, snap.version)
                self._cancel(key)
                self.receiving[key] = asyncio.create_task(
                    self._receive(int(cmd["id"]), snap, cmd.get("held"), cmd.get("held_indices") or [], timeouts))
            case "reroute":
                snap = m.SnapshotAvailable.model_validate(cmd["snap"])
                self.relays.reroute(self.relays.get((snap.job_id, snap.version)), snap)
            case "retire":
                self.relays.retire(int(cmd["job"]), keep_from=int(cmd["keep_from"]))
            case "drop":
                key = (int(cmd["key"][0]), int(cmd["key"][1]))
                self._cancel(key)
                self.relays.drop(key)
            case "drop_other_jobs":
                job = int(cmd["job"])
                for key in [k for k in self.receiving if k[0] != job]:
                    self._cancel(key)
                self.relays.drop_other_jobs(job)
            case "exit":
                return False
            case other:
                self.emit("error", reason=f"unknown command {other!r}")
        return True

    def _cancel(self, key: tuple[int, int]) -> None:
        task = self.receiving.pop(key, None)
        if task is not None:
            task.cancel()

    async def _receive(self, request: int, snap: m.SnapshotAvailable, held: str | None, indices: list[int],
                       timeouts: RelayTimeouts | None) -> None:
        key = (snap.job_id, snap.version)
        try:
            chunks = await asyncio.to_thread(read_held, held, parse_manifest(snap.manifest), indices) if held else None
            _, ordered, source = await self.relays.receive(snap, chunks, timeouts=timeouts)
            self._announce()
            path = self.work_dir / payload_name(*key, request)
            await asyncio.to_thread(write_payload, path, ordered)
            relay = self.relays.get(key)
            self._send_state()  # the last chunks before the result
            self.emit("received", id=request, key=list(key), path=str(path), source=source,
                      stats=asdict(relay.stats) if relay else {})
        except asyncio.CancelledError:
            self.emit("failed", id=request, key=list(key), reason="dropped")
            raise
        except Exception as err:  # the agent's install fails with it, and fetches again
            self.emit("failed", id=request, key=list(key), reason=f"{type(err).__name__}: {err}")
        finally:
            if self.receiving.get(key) is asyncio.current_task():
                self.receiving.pop(key)

    # ---- state ---------------------------------------------------------------------------------

    def _announce(self) -> None:
        if not self.announced and self.relays.port is not None:
            self.announced = True
            self.emit("listening", port=self.relays.port)

    def _send_state(self) -> None:
        """A ``state`` event for each relay whose chunks, completion, sessions or counts changed."""
        for key in [k for k in self.told if k not in self.relays.relays]:
            self.told.pop(key)
        for key, relay in self.relays.relays.items():
            last = self.told.get(key, {"have": set()})
            have = set(relay.have)
            now = {"have": have, "complete": relay.complete, "serving": relay.serving, "stats": asdict(relay.stats)}
            if now != last:
                self.told[key] = now
                self.emit("state", key=list(key), new=sorted(have - last["have"]), complete=now["complete"],
                          serving=now["serving"], stats=now["stats"])

    async def watch(self) -> None:
        alive = 0.0
        while True:
            self._send_state()
            self._announce()
            alive += STATE_EVERY_S
            if alive >= ALIVE_EVERY_S:
                alive = 0.0
                self.emit("alive")
            await asyncio.sleep(STATE_EVERY_S)

    async def close(self) -> None:
        for key in list(self.receiving):
            self._cancel(key)
        await self.relays.close()


async def main(args: argparse.Namespace) -> None:
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader(limit=MAX_LINE)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    child = RelayChild(args, out)
    watcher = asyncio.create_task(child.watch())
    try:
        while line := await reader.readline():  # b"": the agent is gone
            try:
                cmd = json.loads(line)
                if not await child.command(cmd):
                    break
            except (ValueError, KeyError, TypeError, IndexError) as err:
                child.emit("error", reason=f"bad command {line[:200]!r}: {type(err).__name__}: {err}")
    finally:
        watcher.cancel()
        await child.close()
        with contextlib.suppress(Exception):
            out.close()


def _args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m worker_agent.relay_child",
                                description="The agent's relays in a process of their own (driven by the agent).")
    p.add_argument("--worker-id", type=int, required=True)
    p.add_argument("--bandwidth-bps", type=float, help="the link's cap, bytes/s, up and down")
    p.add_argument("--listen", help="HOST:PORT of the relay hub (none: tail only)")
    p.add_argument("--work-dir", type=Path, required=True, help="where received payloads are written for the agent")
    p.add_argument("--debug", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal's Ctrl-C is the agent's: it stops us
    arguments = _args(None)
    logging.basicConfig(level=logging.DEBUG if arguments.debug else logging.INFO,
                        format="%(asctime)s agent relay: %(message)s", datefmt="%H:%M:%S")
    arguments.work_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(arguments))

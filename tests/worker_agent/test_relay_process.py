"""The agent's relays in a child process (worker_agent/relay_process.py, worker_agent/relay_child.py): real child
processes, real sockets, a learner-like origin relay in the test's loop. A version goes down a chain of agents'
relay processes, a relay is rerouted mid-version, a child killed mid-version fails its receive at once and a new
one serves the next version, and a child outlives no agent (its stdin's end, even after a SIGKILL)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from dataplane import credentials
from dataplane import messages as m
from dataplane.broadcast.hub import RelayHub
from dataplane.broadcast.relay import RelayTimeouts, SnapshotRelay
from dataplane.snapshot import build_manifest, split
from worker_agent.relay_process import ProcessRelays, RelayChildError
from worker_agent.status import Reporter

SECRET = credentials.new_secret()
JOB = 7
CHUNK = 64 * 1024
TIMEOUTS = RelayTimeouts(stall=3.0, give_up=30.0)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def credential(worker: int) -> str:
    return credentials.issue(SECRET, job_id=JOB, worker_id=worker, lowest=0, highest=100,
                             expires=int(time.time()) + 3600)


def offer(manifest, *, worker: int, parent: str, parent_worker: int | None = None,
          children: tuple[int, ...] = ()) -> m.SnapshotAvailable:
    """What the site would send ``worker`` for this version (the fallback URL a closed port: HTTP would fail)."""
    return m.SnapshotAvailable(job_id=JOB, version=manifest.version, url=f"http://127.0.0.1:{free_port()}/v1/",
                               manifest=manifest.model_dump(mode="json"), published_at=time.time(), parent=parent,
                               parent_worker_id=parent_worker, children=list(children), credential=credential(worker),
                               child_credential_sha256={c: credentials.fingerprint(credential(c)) for c in children})


class Origin:
    """The learner's side: a hub serving full relays of the versions, any child with a valid credential."""

    def __init__(self) -> None:
        self.hub, self.address = RelayHub(), ""

    async def __aenter__(self) -> Origin:
        self.address = f"127.0.0.1:{await self.hub.start('127.0.0.1', 0)}"
        return self

    async def __aexit__(self, *exc) -> None:
        await self.hub.close()

    def publish(self, version: int, size: int = 16 * CHUNK) -> tuple[bytes, object]:
        payload = os.urandom(size)
        manifest = build_manifest(payload, job_id=JOB, version=version, chunk_bytes=CHUNK)
        self.hub.register(SnapshotRelay(manifest, worker_id=0, chunks=dict(enumerate(split(payload, CHUNK))),
                                        max_children=4, secret=SECRET))
        return payload, manifest


def agent(tmp_path: Path, worker: int, *, listen: bool = True, bw: float | None = None,
          reports: list | None = None, cache: str = "") -> ProcessRelays:
    async def report(message) -> None:
        (reports if reports is not None else []).append(message)
    return ProcessRelays(worker_id=worker, bandwidth_bps=bw, listen=f"127.0.0.1:{free_port()}" if listen else None,
                         report=report, work_dir=tmp_path / (cache or f"w{worker}"))


async def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"no {what} within {timeout} s"
        await asyncio.sleep(0.02)


def test_a_version_goes_down_a_chain_of_relay_processes_every_chunk_verified(tmp_path):
    async def main() -> None:
        # one cache for both, as agents run by one user share ~/.cache/echo2: their payload files must not meet
        a, b = agent(tmp_path, 1, bw=2_000_000, cache="cache"), agent(tmp_path, 2, listen=False, cache="cache")
        try:
            async with Origin() as origin:
                payload, manifest = origin.publish(1)
                await a.start_hub()
                assert a.hub is not None and a.hub.port == int(a.listen.rpartition(":")[2])
                key = (JOB, 1)
                to_a = asyncio.create_task(a.receive(offer(manifest, worker=1, parent=origin.address, children=(2,)),
                                                     timeouts=TIMEOUTS))
                to_b = asyncio.create_task(b.receive(offer(manifest, worker=2, parent=a.listen, parent_worker=1),
                                                     timeouts=TIMEOUTS))
                await until(lambda: key in a and key in b, "relays")
                assert a.busy() and b.busy()  # receiving: what the pause experiment and the status read
                await until(lambda: 0 < len(b.get(key).have) < len(manifest.chunks), "chunks at the tail", 20)
                # the status line's install progress (what worker_agent.status reads of the session) follows the child
                (install,) = Reporter().installs(SimpleNamespace(installing={key: None}, relays=b.relays), JOB, 0.0)
                assert 0 < install.chunks <= install.total == len(manifest.chunks)
                (_, got_a, source_a), (_, got_b, source_b) = await asyncio.wait_for(asyncio.gather(to_a, to_b), 60)
                assert b"".join(got_a) == payload and b"".join(got_b) == payload
                assert (source_a, source_b) == ("parent", "parent")
                tail = b.get(key)
                assert tail.complete and tail.have == list(range(len(manifest.chunks)))
                assert (tail.stats.from_parent, tail.stats.from_fallback) == (len(manifest.chunks), 0)
                await until(lambda: a.get(key).stats.children_served == 1 and not a.busy(), "A done serving")
                assert not b.busy()
                assert not list(a.work_dir.iterdir()) + list(b.work_dir.iterdir())  # every payload file deleted
        finally:
            await a.close()
            await b.close()
        assert not a.work_dir.exists() and not b.work_dir.exists()

    asyncio.run(main())


def test_a_relay_process_rerouted_mid_version_finishes_from_its_new_parent(tmp_path):
    async def main() -> None:
        slow, fast, tail = agent(tmp_path, 1, bw=150_000), agent(tmp_path, 2), agent(tmp_path, 3, listen=False)
        try:
            async with Origin() as origin:
                payload, manifest = origin.publish(1)
                key = (JOB, 1)
                await fast.receive(offer(manifest, worker=2, parent=origin.address), timeouts=TIMEOUTS)
                await slow.start_hub()
                to_slow = asyncio.create_task(slow.receive(offer(manifest, worker=1, parent=origin.address,
                                                                 children=(3,)), timeouts=TIMEOUTS))
                to_tail = asyncio.create_task(tail.receive(offer(manifest, worker=3, parent=slow.listen,
                                                                 parent_worker=1), timeouts=TIMEOUTS))
                await until(lambda: key in tail and len(tail.get(key).have) >= 2, "two chunks from the slow parent")
                assert len(tail.get(key).have) < len(manifest.chunks)
                fast.reroute(fast.get(key), offer(manifest, worker=2, parent=origin.address, children=(3,)))
                tail.reroute(tail.get(key), offer(manifest, worker=3, parent=fast.listen, parent_worker=2))
                _, got, source = await asyncio.wait_for(to_tail, 60)
                assert b"".join(got) == payload and source == "parent"
                stats = tail.get(key).stats
                assert stats.parent_switches >= 1 and stats.resumed_with >= 2 and stats.from_fallback == 0
                assert stats.from_parent == len(manifest.chunks)  # each chunk once: what it held was kept
                to_slow.cancel()
        finally:
            for relays in (slow, fast, tail):
                await relays.close()

    asyncio.run(main())


def test_a_relay_process_killed_mid_version_fails_its_receive_and_a_new_one_serves_the_next(tmp_path, caplog):
    async def main() -> None:
        a = agent(tmp_path, 1, bw=150_000)
        try:
            async with Origin() as origin:
                _, manifest = origin.publish(1)
                await a.start_hub()
                first = a.proc.pid
                receiving = asyncio.create_task(a.receive(offer(manifest, worker=1, parent=origin.address),
                                                          timeouts=TIMEOUTS))
                await until(lambda: (JOB, 1) in a and len(a.get((JOB, 1)).have) >= 2, "two chunks")
                assert a.busy()
                os.kill(first, signal.SIGKILL)
                with pytest.raises(RelayChildError, match=rf"relay process \(pid {first}\) exited with code -9"):
                    await asyncio.wait_for(receiving, 10)  # at once, not after a relay timeout
                assert (JOB, 1) not in a and not a.busy()
                await until(lambda: a.hub is not None and a.proc is not None and a.proc.pid != first,
                            "a new relay process listening", 20)
                payload, manifest = origin.publish(2, size=4 * CHUNK)
                _, got, source = await asyncio.wait_for(
                    a.receive(offer(manifest, worker=1, parent=origin.address), timeouts=TIMEOUTS), 60)
                assert b"".join(got) == payload and source == "parent"
                with socket.create_connection(("127.0.0.1", a.hub.port), timeout=5):
                    pass  # the hub listens on its port again
        finally:
            await a.close()

    with caplog.at_level("ERROR", logger="echo2.agent"):
        asyncio.run(main())
    died = [r.getMessage() for r in caplog.records if "exited with code -9" in r.getMessage()]
    assert len(died) == 1 and "1 receive(s) in flight fail, starting a new one" in died[0]


AGENT = textwrap.dedent("""
    import asyncio, sys
    from pathlib import Path
    from worker_agent.relay_process import ProcessRelays

    async def nothing(message):
        pass

    async def main():
        relays = ProcessRelays(worker_id=1, bandwidth_bps=None, listen=sys.argv[1], report=nothing,
                               work_dir=Path(sys.argv[2]))
        await relays.start_hub()
        print(relays.proc.pid, flush=True)
        await asyncio.sleep(600)

    asyncio.run(main())
""")


def test_a_relay_process_exits_when_its_agent_is_killed(tmp_path):
    """SIGKILL leaves the agent no time to stop its child: the child sees its stdin end and exits, freeing the port."""
    port = free_port()
    parent = subprocess.Popen([sys.executable, "-c", AGENT, f"127.0.0.1:{port}", str(tmp_path / "work")],
                              stdout=subprocess.PIPE, text=True, start_new_session=True)
    child = None
    try:
        child = int(parent.stdout.readline())
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass  # the child's hub listens
        parent.kill()
        parent.wait(10)
        deadline = time.monotonic() + 10
        while _alive(child):
            assert time.monotonic() < deadline, "the relay process outlived its agent by 10 s"
            time.sleep(0.05)
        with socket.socket() as s:  # nothing listens on the port any more: a new agent's relay can
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            s.bind(("127.0.0.1", port))
            s.listen()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait(10)
        if child is not None and _alive(child):
            os.kill(child, signal.SIGKILL)


def _alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie of an exited child whose parent died counts as gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rpartition(")")[2].split()[0] != "Z"
    except FileNotFoundError:
        return False

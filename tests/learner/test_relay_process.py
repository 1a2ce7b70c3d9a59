"""The learner's relay hub in a process of its own (dataplane/broadcast/origin.py, origin_process.py): served by
another pid than the learner's, gone with the learner (stdin's end, even after SIGKILL) and after ``stop()``,
restarted on the same port serving the same versions when it dies, the job's secret applied whenever it comes."""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dataplane.broadcast import framing
from dataplane.broadcast.driver import RelayProcessError
from dataplane.broadcast.relay import SnapshotRelay
from dataplane.credentials import issue, new_secret
from dataplane.snapshot import parse_manifest
from learner.serving import LearnerRelay, manifest_json
from learner.settings import LearnerSettings
from learner.snapshots import SnapshotStore

JOB = 5
SECRET = new_secret()


def cred(version: int, *, secret: str = SECRET, worker_id: int = 9) -> str:
    return issue(secret, job_id=JOB, worker_id=worker_id, lowest=version, highest=version,
                 expires=int(time.time()) + 600)


@pytest.fixture
def store(tmp_path):
    store = SnapshotStore(tmp_path / "snapshots", job_id=JOB, chunk_bytes=1024, keep=4, dtype="fp32", full_every=1)
    store.write(torch.nn.Linear(32, 16), 1)
    return store


def pull(relay: LearnerRelay, manifest, credential: str | None) -> bytes:
    """A seed's whole pull of ``manifest``'s version from the relay's advertised address."""
    host, _, port = relay.address.rpartition(":")

    async def seed() -> bytes:
        child = SnapshotRelay(parse_manifest(manifest_json(manifest)), worker_id=9, credential=credential)
        child.set_parent(host, int(port))
        return await asyncio.wait_for(child.receive(), 30)

    return asyncio.run(seed())


def knock(relay: LearnerRelay, version: int, credential: str | None) -> framing.Frame:
    """A seed's hello; the hub's first answer (``accept`` or ``refuse`` with its reason)."""
    host, _, port = relay.address.rpartition(":")

    async def hello() -> framing.Frame:
        reader, writer = await framing.open_peer(host, int(port), timeout=5)
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=version, worker_id=9, have=[],
                                                        credential=credential), peer="hub", timeout=5)
        frame = await framing.read_frame(reader, peer="hub", timeout=10)
        writer.close()
        return frame

    return asyncio.run(hello())


def listener_pid(port: int) -> int:
    """The pid whose file descriptors hold the socket listening on ``port`` (from /proc, not from the hub)."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] == "0A":  # 0A: LISTEN
                inodes.add(fields[9])
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
            if any(os.readlink(f"/proc/{pid}/fd/{fd}") in {f"socket:[{i}]" for i in inodes} for fd in fds):
                return int(pid)
        except OSError:  # gone meanwhile, or not ours to read
            continue
    raise AssertionError(f"no process listens on port {port}")


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    return state != "Z"


def until(check, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"no {what} within {timeout:g} s")
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_hub_is_served_by_a_child_process_unless_told_to_run_in_a_thread(store, mode):
    relay = LearnerRelay(store, uplink_bps=None, mode=mode)
    try:
        owner = listener_pid(relay.port)
        assert owner == relay.pid and (owner != os.getpid()) == (mode == "process")
    finally:
        relay.stop()


def test_stop_leaves_no_process_and_no_port(store):
    relay = LearnerRelay(store, uplink_bps=None, secret=SECRET)
    relay.serve(1)
    pid, port = relay.pid, relay.port
    relay.stop()
    assert not alive(pid) and relay.pid is None
    with pytest.raises(framing.PeerClosed, match="unreachable"):
        asyncio.run(framing.open_peer("127.0.0.1", port, timeout=2))


def test_the_child_exits_when_its_stdin_closes(store):
    child = subprocess.Popen([sys.executable, "-m", "dataplane.broadcast.origin", "--root", str(store.root), "--job",
                              str(JOB)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert json.loads(child.stdout.readline())["event"] == "listening"
        child.stdin.close()
        assert child.wait(10) == 0
    finally:
        child.kill()
        child.wait(5)


def test_the_child_outlives_no_learner_killed_with_sigkill(store, tmp_path):
    """A learner killed at once (no stop(), no exit handlers): its relay sees stdin's end and exits."""
    script = ("import sys, time\n"
              "from learner.serving import LearnerRelay\nfrom learner.snapshots import SnapshotStore\n"
              f"relay = LearnerRelay(SnapshotStore({str(store.root)!r}, job_id={JOB}), uplink_bps=None)\n"
              "print(relay.pid, flush=True)\n"
              "time.sleep(600)\n")
    learner = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        child = int(learner.stdout.readline())
        assert alive(child) and child != learner.pid
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        until(lambda: not alive(child), "exit of the orphaned relay", 10)
    finally:
        learner.kill()
        learner.wait(5)


def test_a_killed_child_is_restarted_on_the_same_port_and_serves_the_same_versions(store, caplog):
    caplog.set_level(logging.INFO, logger="echo2.learner")
    relay = LearnerRelay(store, uplink_bps=None, secret=SECRET)
    try:
        relay.serve(1)
        manifest = store.manifest(1)
        first, address = relay.pid, relay.address
        os.kill(first, signal.SIGKILL)
        until(lambda: relay.pid not in (None, first) and alive(relay.pid), "restarted relay")
        assert relay.address == address and listener_pid(relay.port) == relay.pid
        assert pull(relay, manifest, cred(1)) == b"".join(  # the secret and v1, both told to the new child
            (store.root / "v1" / "chunks" / str(i)).read_bytes() for i in range(len(manifest.chunks)))
        assert set(relay.served()) == {1} and relay.served()[1].children_served == 1
        restarts = [r.getMessage() for r in caplog.records if "restarting it on port" in r.getMessage()]
        assert len(restarts) == 1 and f"(pid {first}) exited with code -9" in restarts[0], restarts
        second = relay.pid
        store.write(torch.nn.Linear(32, 16), 2)
        relay.serve(2)  # and it goes on taking commands
        assert relay.pid == second and set(relay.served()) == {1, 2}
    finally:
        relay.stop()


def test_a_command_right_after_the_child_died_is_carried_out_by_its_successor(store):
    relay = LearnerRelay(store, uplink_bps=None, secret=SECRET)
    try:
        relay.serve(1)
        child = relay._hub._child  # the command restarts it, or its stdout thread did first: either way v2 is served
        os.kill(child.pid, signal.SIGKILL)
        child.proc.wait(5)
        store.write(torch.nn.Linear(32, 16), 2)
        relay.serve(2)
        assert relay.pid != child.pid and set(relay.served()) == {1, 2}
        assert knock(relay, 2, cred(2)).type == "accept"
    finally:
        relay.stop()


@pytest.mark.parametrize("mode", ["process", "thread"])
def test_the_secret_set_before_or_after_serving_admits_credentials_and_only_those(store, mode):
    early = LearnerRelay(store, uplink_bps=None, mode=mode, secret=SECRET)
    late = LearnerRelay(store, uplink_bps=None, mode=mode)
    try:
        early.serve(1)
        late.serve(1)
        refused = knock(late, 1, cred(1))
        assert refused.type == "refuse" and "holds no credential of worker 9" in refused.header["reason"]
        late.set_secret(SECRET)  # the site's reply to the announcement, after v1 was served
        manifest = store.manifest(1)
        for relay in (early, late):
            assert len(pull(relay, manifest, cred(1))) == manifest.total_bytes
            wrong = knock(relay, 1, cred(1, secret=new_secret()))
            assert wrong.type == "refuse" and wrong.header["reason"] == "worker 9: bad credential signature"
        assert late.served()[1].refused == 2 and early.served()[1].refused == 1
    finally:
        early.stop()
        late.stop()


def test_a_version_not_in_the_store_is_a_clear_error_and_the_hub_goes_on(store):
    relay = LearnerRelay(store, uplink_bps=None, secret=SECRET)
    try:
        with pytest.raises(RelayProcessError, match=r"serve: .*v7"):
            relay.serve(7)
        relay.serve(1)
        assert set(relay.served()) == {1}
    finally:
        relay.stop()


def test_a_port_taken_is_a_clear_error_and_a_mode_unknown_is_refused(store):
    taken = LearnerRelay(store, uplink_bps=None)
    try:
        with pytest.raises(RelayProcessError, match=rf"127.0.0.1:{taken.port}: cannot listen"):
            LearnerRelay(store, uplink_bps=None, port=taken.port)
    finally:
        taken.stop()
    with pytest.raises(ValueError, match="relay mode must be one of process, thread, not 'fiber'"):
        LearnerRelay(store, uplink_bps=None, mode="fiber")


def test_the_learner_setting_defaults_to_a_process_and_reads_its_variable(monkeypatch):
    assert LearnerSettings(server="http://s", job=1, token="t").relay_mode == "process"
    monkeypatch.setenv("ECHO2_LEARNER_RELAY_MODE", "thread")
    assert LearnerSettings(server="http://s", job=1, token="t").relay_mode == "thread"
    monkeypatch.setenv("ECHO2_LEARNER_RELAY_MODE", "fiber")
    with pytest.raises(ValueError, match="relay_mode"):
        LearnerSettings(server="http://s", job=1, token="t")


def test_the_childs_warnings_land_in_the_learners_log(store, capfd):
    """The child's stderr is the learner's (its log): a refused credential is not lost with the process."""
    relay = LearnerRelay(store, uplink_bps=None, secret=SECRET)
    err = []
    try:
        relay.serve(1)
        pid = relay.pid
        assert knock(relay, 1, cred(1, secret=new_secret())).type == "refuse"
        until(lambda: err.append(capfd.readouterr().err) or "bad credential signature" in "".join(err),
              "the refusal's log line", 10)
    finally:
        relay.stop()
    line = next(line for line in "".join(err).splitlines() if "bad credential signature" in line)
    assert f"learner relay[{pid}]: relay of worker 0 (job {JOB} v1) refused" in line, line


def test_stopping_while_seeds_are_being_served_logs_no_traceback(tmp_path, capfd):
    """The job ends while two seeds still pull (one sending, one waiting for the shared B0 bucket): the child exits
    at once and quietly (Python 3.11 logged each cancelled session as an 'Exception in callback')."""
    store = SnapshotStore(tmp_path / "big", job_id=JOB, keep=4, dtype="fp32", full_every=1)
    store.write(torch.nn.Linear(512, 512), 1)  # 1 MB at 100 kB/s: still sending when stopped
    relay = LearnerRelay(store, uplink_bps=100_000, secret=SECRET)
    relay.serve(1)
    host, _, port = relay.address.rpartition(":")
    loop = asyncio.new_event_loop()

    async def slow_seed(worker_id: int) -> str:
        reader, writer = await framing.open_peer(host, int(port), timeout=5)
        await framing.write_frame(writer, framing.hello(job_id=JOB, version=1, worker_id=worker_id, have=[],
                                                        credential=cred(1, worker_id=worker_id)),
                                  peer="hub", timeout=5)
        return (await framing.read_frame(reader, peer="hub", timeout=10)).type  # then reads nothing more

    async def seeds() -> list[str]:
        return await asyncio.gather(slow_seed(9), slow_seed(10))

    try:
        assert loop.run_until_complete(seeds()) == ["accept", "accept"]
        time.sleep(0.5)
        pid = relay.pid
        relay.stop()
        assert not alive(pid)
    finally:
        relay.stop()
        loop.close()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception in callback" not in err, err


def test_a_serve_waits_for_the_version_to_be_read_longer_the_larger_it_is(store) -> None:
    # A base of several GB read from a slow disk must not be taken for a hung child (killed, restarted, read again).
    from dataplane.broadcast.origin_process import READ_FLOOR_BPS, OriginProcess

    hub = OriginProcess(store.root, JOB, uplink_bps=None, ack_timeout=60.0)
    try:
        manifest = json.loads((store.root / "v1" / "manifest.json").read_text())
        assert hub._serve_timeout(1) == pytest.approx(60.0 + manifest["total_bytes"] / READ_FLOOR_BPS)
        big = store.root / "v9"
        big.mkdir()
        (big / "manifest.json").write_text(json.dumps({**manifest, "version": 9, "total_bytes": 8 * 10**9}))
        assert hub._serve_timeout(9) == pytest.approx(60.0 + 160.0)  # 8 GB at 50 MB/s
        assert hub._serve_timeout(42) == 60.0  # no such version: the child says so within the plain wait
    finally:
        hub.stop()

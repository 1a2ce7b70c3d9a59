"""The WAN in network namespaces (bench/wan/): the profiles, our delay proxy and its tap, teardown after
exit, SIGTERM and kill -9, a small topology (learner, site, two agents on 40 ms / 20 Mbit links) training a few steps
of the demo's tiny job with every record trained once, and (slow) the fault script: a relay killed mid-broadcast and
a partition, each recovered from. The namespace tests skip, with the reason, where namespaces cannot be created (not
root, no ip or tc)."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from bench.wan import netns, profile, proxy
from bench.wan.stack import Job

ROOT = Path(__file__).resolve().parents[1]
NO_NAMESPACES = netns.unavailable()
needs_namespaces = pytest.mark.skipif(NO_NAMESPACES is not None, reason=f"no network namespaces: {NO_NAMESPACES}")

CI_LINKS = """
[learner]
up_mbit = 20
down_mbit = 20
rtt_ms = 40
[site]
up_mbit = 20
down_mbit = 20
rtt_ms = 40
[agents]
count = 2
up_mbit = 20
down_mbit = 20
rtt_ms = 40
"""


def test_shipped_profiles_load() -> None:
    harsh = profile.load("harsh")
    assert [a.rtt_ms for a in harsh.agents] == [150] * 8 and harsh.agents[0].loss == 0.01
    assert harsh.agents[-1].up_mbit == 10 and harsh.agents[0].up_mbit == 50  # the one slow worker, last
    assert harsh.with_agents(4).agents[-1].up_mbit == 10  # kept in a smaller run
    assert profile.load("paper").learner.up_bps == 12_500_000  # B0 = 2 Bw: two chains


def test_added_delay_gives_every_path_that_much_more_one_way() -> None:
    """``bench_wan.py --add-delay-ms 20`` (issue 49: the rates profile +20 ms): each path crosses two links, so each
    link's round trip grows by the delay and every path's one way by the same."""
    from bench.wan.proxy import Path as ProxyPath

    rates = profile.load("rates").with_agents(8)
    slower = profile.with_added_delay(rates, 20)
    assert [a.up_mbit for a in slower.agents] == [50] * 8 and slower.learner.up_mbit == 200
    one_way = ProxyPath.between(vars(slower.agents[0]), vars(slower.agents[1])).delay_s
    seed = ProxyPath.between(vars(slower.learner), vars(slower.agents[0])).delay_s
    assert one_way == seed == pytest.approx(0.020)
    assert profile.with_added_delay(rates, 0) is rates


def test_profile_errors_name_the_key() -> None:
    with pytest.raises(ValueError, match="agents: unknown key.*rtt"):
        profile.parse("[agents]\nrtt = 40\n")
    with pytest.raises(ValueError, match="no profile 'lan'.*harsh, paper"):
        profile.load("lan")
    with pytest.raises(ValueError, match="loss"):
        profile.parse("[site]\nloss = 1.5\n")


def test_proxy_keeps_bytes_in_order_under_jitter_and_loss() -> None:
    path = proxy.Path.between({"rtt_ms": 100, "jitter_ms": 30, "loss": 0.2}, {"rtt_ms": 50})
    assert path.delay_s == pytest.approx(0.075) and path.loss == pytest.approx(0.2)
    rng, last, dues = random.Random(1), 0.0, []
    for i in range(200):
        last = path.due(i * 0.001, last, rng)
        dues.append(last)
    assert dues == sorted(dues)  # TCP delivers in order: jitter never reorders
    assert max(d - i * 0.001 for i, d in enumerate(dues)) >= 0.075 - 0.03 + proxy.MIN_RTO_S  # a loss cost an RTO


async def test_proxy_delays_each_direction_by_the_links() -> None:
    async def echo(reader, writer):
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    service = await asyncio.start_server(echo, "127.0.0.1", 0)
    target = service.sockets[0].getsockname()[1]
    relay = await asyncio.start_server(
        lambda r, w: proxy.serve_one(r, w, ("127.0.0.1", target), {"rtt_ms": 120}, {}, 0), "127.0.0.1", 0)
    loop = asyncio.get_running_loop()
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.sockets[0].getsockname()[1])
    started = loop.time()
    writer.write(b"ping")
    assert await reader.read(100) == b"ping"
    assert loop.time() - started >= 0.12  # 60 ms each way
    writer.close()
    relay.close()
    service.close()


async def test_a_connection_costs_the_handshake_whoever_speaks_first() -> None:
    """TCP's handshake on the emulated path: a service that speaks first and one that answers the peer's first words
    each get their first byte to the peer four one-way delays after its connect (SYN, SYN-ACK, then the ACK with the
    peer's first bytes, then the answer), as on a real path: neither protocol is a delay ahead of the other."""
    async def speaks_first(reader, writer):
        writer.write(b"hi")
        await writer.drain()
        await reader.read(100)
        writer.close()

    async def answers(reader, writer):
        writer.write(await reader.read(100))
        await writer.drain()
        writer.close()

    loop = asyncio.get_running_loop()
    for handler, first_words in ((speaks_first, b""), (answers, b"ping")):
        service = await asyncio.start_server(handler, "127.0.0.1", 0)
        target = service.sockets[0].getsockname()[1]
        front = await asyncio.start_server(
            lambda r, w, target=target: proxy.serve_one(r, w, ("127.0.0.1", target), {"rtt_ms": 120}, {}, 0),
            "127.0.0.1", 0)
        started = loop.time()
        reader, writer = await asyncio.open_connection("127.0.0.1", front.sockets[0].getsockname()[1])
        writer.write(first_words)
        assert await reader.read(100) in (b"hi", b"ping")
        assert loop.time() - started >= 4 * 0.06, handler.__name__
        writer.close()
        front.close()
        service.close()


async def test_a_reset_from_one_side_reaches_the_other_after_the_links_delay() -> None:
    """A killed peer's reset is passed on through the proxy: the service sees its connection end about one way
    later, not when it next writes (a killed agent held the site's websocket open until daphne's ping)."""
    ended = asyncio.get_running_loop().create_future()

    async def silent(reader, writer):
        with contextlib.suppress(ConnectionError):
            await reader.read(100)  # returns b"" or raises once the proxy passes the reset on
        ended.set_result(asyncio.get_running_loop().time())

    service = await asyncio.start_server(silent, "127.0.0.1", 0)
    target = service.sockets[0].getsockname()[1]
    relay = await asyncio.start_server(
        lambda r, w: proxy.serve_one(r, w, ("127.0.0.1", target), {"rtt_ms": 120}, {}, 0), "127.0.0.1", 0)
    reader, writer = await asyncio.open_connection("127.0.0.1", relay.sockets[0].getsockname()[1])
    await asyncio.sleep(0.5)  # the proxy has connected on to the service (after the handshake's 3 x 60 ms)
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close = reset, as a kill can
    reset_at = asyncio.get_running_loop().time()
    writer.transport.abort()
    ended_at = await asyncio.wait_for(ended, 5)
    assert ended_at - reset_at >= 0.06 * 0.9  # one way of the link
    relay.close()
    service.close()


async def test_tap_times_each_reply_and_measures_transfers(tmp_path: Path) -> None:
    """The proxy's tap (bench/wan/tap.py): a websocket request's round trip as the agent sees it (both directions'
    delay in it), the connection counted, and a bulk transfer's bytes as the peer acknowledged them."""
    import json

    import websockets

    async def site(ws):
        async for text in ws:
            await ws.send(json.dumps({"type": "submitted", "ref_id": json.loads(text)["id"]}))

    async def bulk(reader, writer):
        writer.write(b"x" * 3_000_000)
        await writer.drain()
        writer.close()

    tap = proxy.Tap(str(tmp_path / "site.jsonl"), "site")
    async with websockets.serve(site, "127.0.0.1", 0, compression=None) as server:  # as daphne: no deflate
        bulk_server = await asyncio.start_server(bulk, "127.0.0.1", 0)
        targets = {"ws": server.sockets[0].getsockname()[1], "bulk": bulk_server.sockets[0].getsockname()[1]}
        fronts = {kind: await asyncio.start_server(
            lambda r, w, kind=kind: proxy.serve_one(r, w, ("127.0.0.1", targets[kind]), {"rtt_ms": 100}, {}, 0, tap,
                                                    kind), "127.0.0.1", 0) for kind in targets}
        async with websockets.connect(f"ws://127.0.0.1:{fronts['ws'].sockets[0].getsockname()[1]}") as ws:
            for i in range(3):
                await ws.send(json.dumps({"type": "submit", "id": f"r{i}", "groups": [{"lease_id": "x"}]}))
                assert json.loads(await ws.recv())["ref_id"] == f"r{i}"
        reader, writer = await asyncio.open_connection("127.0.0.1", fronts["bulk"].sockets[0].getsockname()[1])
        got = 0
        while chunk := await reader.read(1 << 16):
            got += len(chunk)
        writer.close()
        await asyncio.sleep(0.2)  # the proxy closes its side and writes the burst
        for front in fronts.values():
            front.close()
        bulk_server.close()
    records = [json.loads(line) for line in (tmp_path / "site.jsonl").read_text().splitlines()]
    replies = [r for r in records if r["kind"] == "reply"]
    assert [r["type"] for r in replies] == ["submit"] * 3 and all(r["ms"] >= 100 for r in replies), records
    assert len([r for r in records if r["kind"] == "ws"]) == 1
    bursts = [r for r in records if r["kind"] == "burst"]
    assert got == 3_000_000 and sum(b["bytes"] for b in bursts) >= 2_900_000, records


def ours(pid: int) -> tuple[list[str], list[str]]:
    """Namespaces and host links named for run ``pid``."""
    tag = netns.prefix(pid)
    links = subprocess.run(("ip", "-o", "link"), capture_output=True, text=True).stdout
    return [n for n in netns.namespaces() if n.startswith(tag)], [x for x in links.splitlines() if tag[:-1] in x]


def start_topology() -> subprocess.Popen:
    # SIGINT as a terminal delivers it: a test run started in the background by a shell inherits it ignored, and so
    # would the topology, which would then never see the Ctrl-C this file sends.
    proc = subprocess.Popen((sys.executable, "-m", "bench.wan", "up", "--profile", "harsh", "--agents", "2"),
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    for line in proc.stdout:
        if line.strip() == "ready":
            return proc
    proc.wait(10)
    pytest.fail(f"the topology did not come up (exit {proc.returncode})")


def tear_down(*procs: subprocess.Popen) -> None:
    """Finalizer, on failure too: end the topologies still up and remove the namespaces of every run of ours whose
    process is gone (``down --all-mine`` leaves live runs alone): a failing test once left five namespaces."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)
    subprocess.run((sys.executable, "-m", "bench.wan", "down", "--all-mine"), cwd=ROOT, capture_output=True,
                   timeout=60)


@needs_namespaces
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_topology_removed_on_signal(sig: signal.Signals) -> None:
    proc = start_topology()
    try:
        assert len(ours(proc.pid)[0]) == 5  # core, learner, site, two agents
        proc.send_signal(sig)
        proc.wait(30)
        assert ours(proc.pid) == ([], [])
    finally:
        tear_down(proc)


@needs_namespaces
def test_cleanup_after_kill_9_removes_only_ours() -> None:
    proc = start_topology()
    try:
        survivor = start_topology()  # a live run: down --all-mine leaves it alone
    except BaseException:
        tear_down(proc)
        raise
    try:
        sleeper = subprocess.Popen(("ip", "netns", "exec", netns.prefix(proc.pid) + "a0", "sleep", "600"))
        proc.kill()
        proc.wait(10)
        assert len(ours(proc.pid)[0]) == 5  # kill -9: nothing ran its teardown
        done = subprocess.run((sys.executable, "-m", "bench.wan", "down", "--all-mine"), cwd=ROOT,
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert ours(proc.pid) == ([], [])
        assert sleeper.wait(10) == -signal.SIGKILL  # what ran inside was ended too
        assert len(ours(survivor.pid)[0]) == 5
    finally:
        survivor.terminate()
        survivor.wait(30)
        tear_down(proc, survivor)
    assert ours(survivor.pid) == ([], [])


@needs_namespaces
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_small_wan_trains_every_record_once(tmp_path: Path) -> None:
    from bench.wan.run import run_job

    job = Job(steps=4)
    row = run_job(profile.parse(CI_LINKS, "ci"), tmp_path, job, timeout=240)
    assert row["status"] == "completed" and row["steps"] == job.steps, row
    assert row["lost"] == 0 and row["trained_twice"] == 0 and row["notes"] == [], row
    assert row["trained"] + row["dropped_stale"] + row["leftover_groups"] * job.group == row["accepted"], row
    assert row["max_staleness"] <= job.staleness
    assert row["publications"] >= 1 and row["t_bcast_s"] > 0  # a snapshot crossed the links
    assert not [n for n in netns.namespaces() if n.startswith(netns.prefix(os.getpid()))]


CHAIN_LINKS = CI_LINKS.replace("count = 2", "count = 3")  # B0 = Bw: one chain of three, two relays


@needs_namespaces
@pytest.mark.slow
@pytest.mark.skipif(shutil.which("redis-server") is None, reason="redis-server is not installed")
def test_partition_and_relay_killed_mid_broadcast_recover(tmp_path: Path) -> None:
    """The fault script (bench/wan/faults.py) on a chain of three: the seed killed 1 s into a publication of 8 MB
    (3 s a hop at 20 Mbit/s), then a 15 s partition of another agent. The child installs that version (or a newer
    one) by another path, the partitioned agent generates again under a current version, and no record is lost or
    trained twice. ~3.5 minutes on the 2-core machine."""
    from bench.wan.faults import FaultPlan
    from bench.wan.run import run_job

    # Enough steps that the partitioned agent is back and generating before the job ends: with submits no longer
    # waiting on the database, 40 steps ended first.
    job = Job(steps=70, hidden=448)
    row = run_job(profile.parse(CHAIN_LINKS, "ci-chain"), tmp_path, job, timeout=500,
                  faults=FaultPlan(after_step=3, partition_s=15, kill_after_s=1.0, recover_timeout_s=60))
    assert row["status"] == "completed" and row["fault_error"] is None, row
    assert row["lost"] == 0 and row["trained_twice"] == 0 and row["notes"] == [], row
    relay, cut = row["faults"]["relay"], row["faults"]["partition"]
    assert relay["error"] is None and relay["child_installed_s"] is not None, relay
    assert relay["killed_after_publication_s"] < 3  # while its chunks were on the way to the child
    if cut["error"] is not None or cut["generating_s"] is None:  # what the agent did meanwhile, for the failure
        log = (tmp_path / "logs" / f"agent-{cut['node']}.log").read_text(errors="replace").splitlines()
        pytest.fail(f"the partitioned agent did not recover: {json.dumps(cut)}\nits log's end:\n"
                    + "\n".join(log[-60:]))
    assert cut["reconnect_s"] is not None, cut
    assert not [n for n in netns.namespaces() if n.startswith(netns.prefix(os.getpid()))]

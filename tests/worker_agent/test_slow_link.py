"""An agent on a slow link: versions published faster than it can fetch them do not all download at
once, sharing its downlink so that none finishes (the harsh profile's 10 Mbit/s worker installed nothing for
minutes); a version with no chain child to serve waits while another is fetched, a newer one replaces it, and
the newest is installed once the fetch in flight ends. Real session, real learner snapshot store over HTTP, a
real engine whose build the test holds (a recording socket stands in for the site)."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import torch
from transformers import AutoModelForCausalLM

from worker_agent import timing
from worker_agent.engines import make_engine

from .test_session import assign, learner_side, make_session, push, snapshot, until  # noqa: F401


def test_versions_that_come_while_one_is_fetched_wait_and_only_the_newest_is_installed(
        tmp_path, learner_side, tiny_model_dir):  # noqa: F811 (the imported fixture)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    versions = {}
    for version in (1, 2, 3):
        with torch.no_grad():
            model.model.norm.weight.add_(0.5)
        versions[version] = store.write(model, version)
    gate = threading.Event()

    def held_factory(model_dir: str):
        assert gate.wait(30), "the test never let the base's engine be built"
        return make_engine("hf", model_dir, device="cpu", seed=0)

    async def scenario() -> None:
        session, socket = make_session(tmp_path, [])
        session.installs.engine_factory = held_factory
        await push(session, assign(1, snapshot(store, server, base), digest=base.sha256))
        await until(lambda: (1, 0) in session.installs.installing, "the base being installed")
        for version in (1, 2, 3):  # published while the base is still being installed
            await push(session, snapshot(store, server, versions[version]))
        assert set(session.installs.installing) == {(1, 0)} and session.installs.held[1].version == 3
        assert session.installs.superseded == 2  # v1 and v2: never fetched
        gate.set()
        await until(lambda: session.installs.installed_version(1) == 3, "the newest version installed")
        assert [r["version"] for r in socket.of("snapshot_installed")] == [0, 3]
        assert session.installs.held == {}
        assert session.installs.job.engine.model.model.norm.weight.detach().equal(model.model.norm.weight.detach())
        session._stop_rollout()

    asyncio.run(scenario())


class TricklingServer:
    """An HTTP server that answers every GET of a chunk with a 200, then one byte every 0.2 s: a read never waits
    long, but the fetch would never end (what a per-read timeout alone allowed). ``manifest`` is served whole at
    ``/v0/manifest.json``, so the agent gets as far as the chunks."""

    def __init__(self, manifest: bytes) -> None:
        self.manifest = manifest
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.sock.getsockname()[1]}/v0/"

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stopped.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            threading.Thread(target=self._trickle, args=(conn,), daemon=True).start()

    def _trickle(self, conn: socket.socket) -> None:
        with conn:
            if conn.recv(65536).startswith(b"GET /v0/manifest.json "):
                conn.sendall(b"HTTP/1.0 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(self.manifest), self.manifest))
                return
            conn.sendall(b"HTTP/1.0 200 OK\r\n\r\n")  # no length: the body goes on until the connection ends
            while not self.stopped.wait(0.2):
                try:
                    conn.sendall(b"x")
                except OSError:
                    return

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join(5)
        self.sock.close()


def test_a_fetch_that_never_ends_is_given_up_within_its_derived_bound(
        tmp_path, learner_side, tiny_model_dir, monkeypatch, caplog):  # noqa: F811 (the imported fixture)
    """Each read gets a byte within 0.2 s, so the old per-read timeout never fired; the whole fetch is now bounded
    by 4 x its expected time at the measured rate (here 4 x 3 round trips of at least 0.2 s: 2.4 s, over the floor
    lowered to 1 s), and the install fails with the reason, leaving nothing in flight (nor a thread reading on)."""
    monkeypatch.setattr(timing, "TRANSFER_FLOOR_S", 1.0)
    store, server = learner_side
    base = store.write_base(tiny_model_dir)
    trickling = TricklingServer(base.model_dump_json().encode())
    url = trickling.url

    async def scenario() -> None:
        session, _ = make_session(tmp_path, [])
        session.installs.rates = timing.Rates(declared_bps=1e9)  # a fast link: the floor is the bound
        began = time.monotonic()
        await push(session, assign(1, snapshot(store, server, base, url=url), digest=base.sha256))
        await until(lambda: "install failed" in caplog.text, "the fetch to be given up", timeout=20)
        assert time.monotonic() - began < 10
        assert session.installs.installing == {} and session.installs.installed_version(1) is None
        session._stop_rollout()

    try:
        with caplog.at_level(logging.ERROR, logger="echo2.agent"):
            asyncio.run(scenario())
    finally:
        trickling.stop()
    assert f"v0 from {url}: timed out: {base.total_bytes} bytes not fetched within 2 s" in caplog.text

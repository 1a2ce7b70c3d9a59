"""Snapshot serving: the learner's HTTP server and relay, through which the versions the store wrote
(:mod:`learner.snapshots`) reach the workers. What is published, and when, is the
:class:`~learner.publication.Publisher`'s to decide (:mod:`learner.publication`).

Each version lives in its own directory (manifest.json + chunks/<i>, and a delta's full payload under full/,
:mod:`dataplane.broadcast.store`) and is never modified, so a slow agent can keep downloading an old version
while newer ones appear. Version 0 is the job's base checkpoint directory as one archive
(:mod:`dataplane.basemodel`), kept for the whole job; of the others the newest ``keep`` stay, and every version
published in the last ``retain_s`` seconds.

Both doors check the worker's transfer credential (docs/trust.md) with the job's secret, which the learner
learns from the site's reply to its announcement (:meth:`SnapshotServer.set_secret`,
:meth:`LearnerRelay.set_secret`); until then they refuse everyone.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import threading
import time
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal, get_args

from dataplane.broadcast.origin import OriginHub
from dataplane.broadcast.origin_process import OriginProcess
from dataplane.broadcast.relay import RelayStats
from dataplane.broadcast.store import CHUNKS, MANIFEST, list_versions, version_dir
from dataplane.credentials import CredentialError, parse, verify
from dataplane.dataset.content import PREFIX as DATA
from dataplane.snapshot import FULL, Manifest

from .snapshots import SnapshotStore

__all__ = ["RELAY_MODES", "LearnerRelay", "RelayMode", "SnapshotServer", "manifest_json"]

log = logging.getLogger(__name__)


_SNAPSHOT_PATH = re.compile(rf"^/v(\d{{1,10}})/(?:({FULL})/)?"
                            rf"(?:{re.escape(MANIFEST)}|{re.escape(CHUNKS)}/(\d{{1,10}}))$")
_DATA_PATH = re.compile(rf"^/{DATA}/([0-9a-f]{{64}})/(?:{re.escape(MANIFEST)}|{re.escape(CHUNKS)}/(\d{{1,10}}))$")


class _SnapshotHandler(BaseHTTPRequestHandler):
    """GET ``/v<version>/manifest.json`` and ``/v<version>/chunks/<i>`` (and a delta's full payload, the same under
    ``/v<version>/full/``) with ``Authorization: Bearer <credential>`` valid for this job and version; nothing
    else but the job's data sets (``/data/<digest>/manifest.json`` and ``chunks/<i>``, any credential of the job),
    and never a listing. 401 without a credential, 403 with one
    that does not admit (the reason in a plain body), 404 for a version or chunk not on disk."""

    server: _SnapshotHTTPServer

    def do_GET(self) -> None:  # noqa: N802 - the name is http.server's
        scheme, _, token = self.headers.get("Authorization", "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            self._refuse(401, "a transfer credential is required (Authorization: Bearer <credential>)")
            return
        try:
            path = self._target(self.path.split("?", 1)[0], token.strip())
        except CredentialError as err:
            self._refuse(403, str(err))
            return
        if path is None:
            self._reply(404, b"not found\n")
            return
        try:
            body = path.read_bytes()
        except OSError:
            self._reply(404, f"{self.path}: no such version or chunk (pruned?)\n".encode())
            return
        self.server.gate.count(path)
        self._reply(200, body, content_type="application/octet-stream")

    def _target(self, url_path: str, token: str) -> Path | None:
        """The file ``url_path`` names, once ``token`` admits it (else CredentialError); None: no such path. A data
        set the job trains on (``/data/<digest>/...``, dataplane/dataset/content.py) is open to any credential
        of the job (any of its versions): every worker of the job reads it."""
        gate = self.server.gate
        data = _DATA_PATH.match(url_path)
        if data is not None:
            grant, _, _ = parse(token)
            verify(gate.secret, token, job_id=gate.store.job_id, version=grant.lowest, now=time.time())
            chunk = data.group(2)
            return gate.store.root / DATA / data.group(1) / (MANIFEST if chunk is None else f"{CHUNKS}/{int(chunk)}")
        match = _SNAPSHOT_PATH.match(url_path)
        if match is None:
            return None
        verify(gate.secret, token, job_id=gate.store.job_id, version=int(match.group(1)), now=time.time())
        version, full, chunk = int(match.group(1)), match.group(2), match.group(3)
        return version_dir(gate.store.root, version) / (full or "") / (MANIFEST if chunk is None
                                                                        else f"{CHUNKS}/{int(chunk)}")

    def _refuse(self, code: int, reason: str) -> None:
        self.server.gate.refused[code] += 1
        log.warning("snapshot server refused %s %s from %s:%s: %s", code, self.path[:100], *self.client_address[:2],
                    reason)
        self._reply(code, f"{reason}\n".encode(), bearer=code == 401)

    def _reply(self, code: int, body: bytes, *, content_type: str = "text/plain; charset=utf-8",
               bearer: bool = False) -> None:
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if bearer:
            self.send_header("WWW-Authenticate", 'Bearer realm="echo2-snapshots"')
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format, *args):  # noqa: A002 - signature fixed by the base class
        pass


class _SnapshotHTTPServer(ThreadingHTTPServer):
    gate: SnapshotServer
    # Every worker told of a version fetches its manifest.json at once: socketserver's backlog of 5 dropped their
    # connections and each dropped one waited out TCP's 1 s SYN retransmission (bench/bench_publication.py).
    request_queue_size = 1024


class SnapshotServer:
    """Serves the store's versions to credential holders: GET /v<version>/manifest.json and /v<version>/chunks/<i>
    (a delta's full payload under /v<version>/full/).
    ``refused`` counts refusals by status (401, 403); ``served`` the files sent, ``manifest`` (a version's, its full
    payload's or a data set's) or ``chunk``. A worker with a relay parent (the learner's hub for a chain's head)
    takes the manifest from it, so the manifests sent here are those of workers with no relay parent and of relays
    whose parent failed or lied."""

    def __init__(self, store: SnapshotStore, *, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None, secret: str | None = None) -> None:
        self.store, self.secret = store, secret
        self.refused: Counter[int] = Counter()
        self.served: Counter[str] = Counter()
        self._counting = threading.Lock()  # the handler's threads count at once
        self.httpd = _SnapshotHTTPServer((host, port), _SnapshotHandler)
        self.httpd.gate = self
        self.httpd.daemon_threads = True
        self.host = advertise_host or (host if host not in ("0.0.0.0", "") else "127.0.0.1")
        self.thread = threading.Thread(target=self.httpd.serve_forever, name="snapshot-server", daemon=True)

    def set_secret(self, secret: str | None) -> None:
        """The job's transfer secret (from the site's reply to the announcement): credentials verify from now on."""
        self.secret = secret

    def count(self, path: Path) -> None:
        with self._counting:
            self.served["manifest" if path.name == MANIFEST else "chunk"] += 1

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    def url_for(self, version: int) -> str:
        return f"http://{self.host}:{self.port}/v{version}/"

    def start(self) -> SnapshotServer:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def manifest_json(manifest: Manifest) -> dict:
    return json.loads(manifest.model_dump_json())


RelayMode = Literal["process", "thread"]
RELAY_MODES: tuple[RelayMode, ...] = get_args(RelayMode)


class LearnerRelay:
    """The learner's end of the chain broadcast (docs/broadcast.md): a :class:`RelayHub` serving each published
    version to the chain seeds under one ``B0`` uplink bucket (:class:`~dataplane.broadcast.origin.OriginHub`).

    ``mode="process"`` (the default, the learner's ``relay_mode``): the hub runs in a child process
    (:class:`~dataplane.broadcast.origin_process.OriginProcess`), so training never holds the GIL its event loop waits
    for; it is restarted on the same port if it dies. ``mode="thread"``: on an asyncio loop in a daemon thread of this
    process, as before. The :class:`SnapshotServer` stays the HTTP fallback and the whole path of the star
    strategies."""

    def __init__(self, store: SnapshotStore, *, uplink_bps: float | None, host: str = "127.0.0.1", port: int = 0,
                 advertise_host: str | None = None, secret: str | None = None, mode: RelayMode = "process") -> None:
        if mode not in RELAY_MODES:
            raise ValueError(f"relay mode must be one of {', '.join(RELAY_MODES)}, not {mode!r}")
        self.store, self.secret, self.mode = store, secret, mode
        self._hub: OriginProcess | _RelayThread = (
            OriginProcess(store.root, store.job_id, uplink_bps=uplink_bps, host=host, port=port, secret=secret)
            if mode == "process" else _RelayThread(store, uplink_bps=uplink_bps, host=host, port=port, secret=secret))
        self.port = self._hub.port
        self.host = advertise_host or (host if host not in ("0.0.0.0", "") else "127.0.0.1")

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The process serving the hub (this one in thread mode; None once stopped)."""
        return self._hub.pid

    def serve(self, version: int) -> None:
        """Register version ``version`` (already written by the store) and drop the versions the store pruned."""
        self._hub.serve(version, set(list_versions(self.store.root)))

    def set_secret(self, secret: str | None) -> None:
        """The job's transfer secret: the hub verifies seeds' credentials with it (served versions included)."""
        self.secret = secret
        self._hub.set_secret(secret)

    def set_fan_out(self, version: int, n_chains: int) -> None:
        """The site's plan has ``n_chains`` seeds; one extra slot takes a repaired orphan of a dead seed."""
        self._hub.set_fan_out(version, n_chains)

    def served(self) -> dict[int, RelayStats]:
        """The versions served, each with its relay's statistics (children served and failed, hellos refused)."""
        return {int(v): RelayStats(**stats) for v, stats in self._hub.status()["versions"].items()}

    def stop(self) -> None:
        self._hub.stop()


class _RelayThread:
    """The hub on an asyncio loop in a daemon thread of the learner's process (``relay_mode = "thread"``)."""

    def __init__(self, store: SnapshotStore, *, uplink_bps: float | None, host: str, port: int,
                 secret: str | None) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="snapshot-relay", daemon=True)
        self.thread.start()
        self.origin = OriginHub(store.root, store.job_id, uplink_bps=uplink_bps, secret=secret)
        self.port = self._call(self.origin.start(host, port))
        self.pid: int | None = os.getpid()

    def _call(self, coro, timeout: float = 30.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    async def _run(self, function, *args):
        return function(*args)

    def serve(self, version: int, published: set[int]) -> None:
        self._call(self.origin.serve(version, published))

    def set_secret(self, secret: str | None) -> None:
        self._call(self._run(self.origin.set_secret, secret))

    def set_fan_out(self, version: int, n_chains: int) -> None:
        self._call(self._run(self.origin.set_fan_out, version, n_chains))

    def status(self) -> dict:
        return self._call(self._run(self.origin.status))

    def stop(self) -> None:
        with contextlib.suppress(Exception):
            self._call(self.origin.close(), timeout=5.0)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5.0)
        self.pid = None

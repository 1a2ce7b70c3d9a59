"""What the emulated agents' websocket frames say, recorded below the agent's code.

The probe wraps ``send`` and ``recv`` of websockets' asyncio ``Connection`` (the class every agent socket is), so
the real session runs untouched while every frame it sends or receives is timestamped: requests and the replies
that name them (``id`` / ``ref_id``), refusals, pushes (assign, release, snapshot) and heartbeats. A frame's type
and id are read from its text with a regular expression (group frames are large; nothing else parses them).
"""

from __future__ import annotations

import json
import re
import threading
import time
from collections import Counter, defaultdict

_TYPE = re.compile(r'"type"\s*:\s*"([a-z_]+)"')
_ID = re.compile(r'"id"\s*:\s*"([^"]{1,64})"')
_REF_ID = re.compile(r'"ref_id"\s*:\s*"([^"]{1,64})"')
_LEASE_ID = re.compile(r'"lease_id"\s*:\s*"([^"]{1,128})"')
_VERSION = re.compile(r'"version"\s*:\s*(\d+)')
RESENDABLE = ("submit", "lease_request", "trajectories")
HEAD = 400  # characters read at each end of a frame for its type and id


def frame_head(text: str) -> tuple[str | None, str | None]:
    """The frame's type and request id, from its first and last :data:`HEAD` characters."""
    ends = text if len(text) <= 2 * HEAD else text[:HEAD] + text[-HEAD:]
    kind, ident = _TYPE.search(ends), _ID.search(ends)
    return (kind[1] if kind else None), (ident[1] if ident else None)


class Probe:
    """Events of every socket of one process, by worker id (from the socket's agent key)."""

    def __init__(self, workers_by_key: dict[str, int]) -> None:
        self.workers_by_key = workers_by_key
        self.lock = threading.Lock()
        self.sent: Counter[str] = Counter()
        self.resent: Counter[str] = Counter()  # requests sent again under an id still unanswered, by type
        self.received: Counter[str] = Counter()
        self.pending: dict[tuple[int, str], tuple[str, float]] = {}  # (worker, id) -> request type, sent at
        self.replies: list[tuple[str, float, float, str]] = []  # request type, sent at, latency, reply type
        self.rejections: list[tuple[float, str, str]] = []  # at, refused type, reason
        self.heartbeats: dict[int, list[float]] = defaultdict(list)  # worker -> send times
        self.welcomed: dict[int, float] = {}  # worker -> first welcome
        self.pushes: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))  # type -> worker
        self.snapshots: dict[int, dict[int, float]] = defaultdict(dict)  # version -> worker -> first notice
        self.installed: dict[int, set[int]] = defaultdict(set)  # version -> workers that reported it installed
        self.leased: dict[str, float] = {}  # lease id -> when it came
        self.accepted: set[str] = set()
        self.handed_back: set[str] = set()
        self.refused_groups: set[str] = set()  # a verdict on the group's content (not a transport refusal)

    def worker_of(self, connection) -> int:
        request = getattr(connection, "request", None)
        auth = request.headers.get("Authorization", "") if request is not None else ""
        return self.workers_by_key.get(auth.removeprefix("Bearer "), 0)

    def on_send(self, worker: int, text: str) -> None:
        now = time.time()
        kind, ident = frame_head(text)
        with self.lock:
            self.sent[kind or "?"] += 1
            if kind == "heartbeat":
                self.heartbeats[worker].append(now)
            elif kind == "lease_return":
                self.handed_back.update(_LEASE_ID.findall(text))
            elif kind == "snapshot_installed":
                version = _VERSION.search(text)
                if version:
                    self.installed[int(version[1])].add(worker)
            if ident is not None and (worker, ident) not in self.pending:  # a later part of a group: the same id
                self.pending[(worker, ident)] = (kind or "?", now)
            elif ident is not None and kind in RESENDABLE and self.pending[(worker, ident)][0] == kind:
                self.resent[kind] += 1  # sent again before its reply came (or a large submit's next part)

    def on_receive(self, worker: int, text: str) -> None:
        now = time.time()
        kind, _ = frame_head(text)
        kind = kind or "?"
        with self.lock:
            self.received[kind] += 1
            if kind == "welcome":
                self.welcomed.setdefault(worker, now)
            elif kind in ("assign", "release"):
                self.pushes[kind][worker].append(now)
            elif kind == "snapshot":
                version = _VERSION.search(text)
                if version:
                    self.snapshots[int(version[1])].setdefault(worker, now)
            ref = _REF_ID.search(text)
            request = self.pending.pop((worker, ref[1]), None) if ref else None
            if kind in ("rejected", "lease", "accepted", "submitted"):
                self._verdicts(kind, json.loads(text), request, now)
            if request is not None:
                self.replies.append((request[0], request[1], now - request[1], kind))

    def _verdicts(self, kind: str, message: dict, request, now: float) -> None:
        """Leases granted, groups accepted or refused for their content (``accepted``, or each result of a
        ``submitted``), refusals (``rejected``: transport or content, counted either way)."""
        if kind == "rejected":
            self.rejections.append((now, str(message.get("ref") or (request[0] if request else "?")),
                                    str(message.get("reason", ""))[:80]))
            return
        leases = message if kind == "lease" else (message.get("lease") or {}) if kind == "submitted" else {}
        if leases.get("type") == "lease":
            self.leased.update((lease["lease_id"], now) for lease in leases.get("leases", []))
        elif kind == "submitted" and leases.get("type") == "no_work":
            self.received["no_work (in submitted)"] += 1
        for verdict in [message] if kind == "accepted" else message.get("results", []) if kind == "submitted" else []:
            if verdict.get("accepted"):
                self.accepted.add(verdict["lease_id"])
            else:
                self.refused_groups.add(verdict["lease_id"])

    def summary(self) -> dict:
        from .engine import METER

        with self.lock:
            return {
                "sent": dict(self.sent), "received": dict(self.received), "resent": sum(self.resent.values()),
                "replies": self.replies,
                "rejections": self.rejections, "heartbeats": {str(w): ts for w, ts in self.heartbeats.items()},
                "welcomed": {str(w): t for w, t in self.welcomed.items()},
                "pushes": {k: {str(w): ts for w, ts in v.items()} for k, v in self.pushes.items()},
                "snapshots": {str(v): {str(w): t for w, t in ws.items()} for v, ws in self.snapshots.items()},
                "installed": {str(v): len(ws) for v, ws in self.installed.items()},
                "leased": self.leased, "accepted": sorted(self.accepted), "handed_back": sorted(self.handed_back),
                "refused_groups": sorted(self.refused_groups),
                "unanswered": [(k[0], v[0], v[1]) for k, v in self.pending.items()],
                "generated_groups": METER.groups, "generated_tokens": METER.tokens,
            }

    def progress(self) -> dict:
        """The small figures the bench waits on."""
        from .engine import METER

        with self.lock:
            return {"welcomed": len(self.welcomed), "assigned": len(self.pushes["assign"]),
                    "released": len(self.pushes["release"]),
                    "snapshots": {str(v): len(ws) for v, ws in self.snapshots.items()},
                    "installed": {str(v): len(ws) for v, ws in self.installed.items()},
                    "rejected": len(self.rejections), "generated_groups": METER.groups}


def install(probe: Probe) -> None:
    """Wrap ``send`` and ``recv`` of websockets' asyncio connections (every agent socket of this process)."""
    from websockets.asyncio.connection import Connection

    send, recv = Connection.send, Connection.recv

    async def probed_send(self, message, *args, **kwargs):
        if isinstance(message, str):
            probe.on_send(probe.worker_of(self), message)
        return await send(self, message, *args, **kwargs)

    async def probed_recv(self, *args, **kwargs):
        message = await recv(self, *args, **kwargs)
        if isinstance(message, str):
            probe.on_receive(probe.worker_of(self), message)
        return message

    Connection.send, Connection.recv = probed_send, probed_recv

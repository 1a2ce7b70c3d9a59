"""What a WAN run's records say beyond the site's figures (bench/bench_wan.py's second and third tables): the
proxies' taps (bench/wan/tap.py) for per-hop throughput, reply latency and reconnects; the processes' logs for the
timeouts that fired, by kind; the fault script's events (bench/wan/faults.py) and Redis' append-only file for
recovery; and the simulator's prediction for the same links (simulator/broadcast.py, the site's own planner).
"""

from __future__ import annotations

import json
import math
import re
import statistics
import sys
from collections import Counter
from datetime import datetime
from pathlib import Path

from simulator.broadcast import water_fill

from .profile import Link, Topology

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import fault_audit as fa  # noqa: E402

MIN_BURST_BYTES = 1_000_000  # a hop's transfer: at least one MB acknowledged without a pause
TIMEOUTS = (  # (kind: what firing it does, pattern), first match wins; the last catches what the others miss
    ("reply: request sent again", r"no reply within"),
    ("websocket ping: reconnect", r"keepalive ping timeout|ping timeout"),
    ("connect: retry", r"timed out during opening handshake|timed out while connecting|open_timeout"),
    ("relay stall: parent given up", r"stalled: nothing received for"),
    ("relay give-up: transfer failed", r"no progress for|nothing to send or hear for"),
    ("snapshot fetch: given up, fetched again", r"bytes not fetched within|of the body's bytes by the deadline"),
    ("site: relay parent silent, excised", r"no heartbeat for \d+ s|no install of v\d+ \d+ s after"),
    ("site: worker silent, released", r"released: silent:"),
    ("other", r"(?i)timed? ?out|timeout"),
)
RECONNECTING = re.compile(r"reconnecting in")


def read_taps(directory: Path) -> list[dict]:
    out = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text(errors="replace").splitlines():
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut short by a killed proxy
                continue
    return out


def percentiles(values: list[float]) -> dict:
    if not values:
        return {"n": 0, "p50": None, "p95": None, "p99": None}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]

    return {"n": len(ordered), "p50": at(0.50), "p95": at(0.95), "p99": at(0.99)}


def reply_latency(records: list[dict], *, since: float = 0.0, until: float = math.inf) -> dict:
    """The agents' request/reply round trips (ms) the site's proxy saw, p50/p95/p99 (``since``/``until``: wall)."""
    return percentiles([r["ms"] for r in records if r["kind"] == "reply" and since <= r["t"] < until])


def reconnects(records: list[dict], agents: dict[str, str]) -> dict[str, int]:
    """Websockets each agent opened after its first (``agents``: address -> node)."""
    opened = Counter(agents.get(r["peer"], r["peer"]) for r in records if r["kind"] == "ws")
    return {node: n - 1 for node, n in sorted(opened.items()) if n > 1}


def hops(records: list[dict], net_nodes: dict[str, tuple[str, Link]]) -> list[dict]:
    """Every transfer of at least MIN_BURST_BYTES a parent's proxy delivered: parent, child, Mbit/s, and the
    link's rate for it: its max-min fair share of the parent's uplink among the transfers the parent was sending
    at the middle of it (a star's pulls share B0), each within its child's downlink (simulator/broadcast.py
    ``water_fill``). ``net_nodes``: address -> (node, link)."""
    by_node = {node: link for node, link in net_nodes.values()}
    bursts = [r for r in records if r["kind"] == "burst" and r["bytes"] >= MIN_BURST_BYTES and r["t1"] > r["t0"]]
    out = []
    for r in bursts:
        child, child_link = net_nodes.get(r["peer"], (r["peer"], None))
        middle = (r["t0"] + r["t1"]) / 2
        sharing = [o for o in bursts if o["node"] == r["node"] and o["t0"] <= middle <= o["t1"]]
        caps = {i: net_nodes[o["peer"]][1].down_mbit if o["peer"] in net_nodes else math.inf
                for i, o in enumerate(sharing)}  # max-min fair shares of the parent's uplink, each within its child's
        rate = water_fill(caps, by_node[r["node"]].up_mbit)[next(i for i, o in enumerate(sharing) if o is r)]
        out.append({"parent": r["node"], "child": child, "port": r["port"], "mb": r["bytes"] / 1e6,
                    "mbit_s": 8 * r["bytes"] / (r["t1"] - r["t0"]) / 1e6, "link_mbit_s": rate, "sharing": len(sharing),
                    "t0": r["t0"], "t1": r["t1"]})
    return out


def hop_summary(found: list[dict]) -> dict:
    if not found:
        return {"hops": 0, "hop_mbit_s": None, "hop_ratio": None, "seed_ratio": None, "relay_ratio": None}
    ratio = [h["mbit_s"] / h["link_mbit_s"] for h in found]
    seed = [h["mbit_s"] / h["link_mbit_s"] for h in found if h["parent"] == "learner"]
    relay = [h["mbit_s"] / h["link_mbit_s"] for h in found if h["parent"] != "learner"]
    return {"hops": len(found), "hop_mbit_s": statistics.median(h["mbit_s"] for h in found),
            "hop_ratio": statistics.median(ratio), "seed_ratio": statistics.median(seed) if seed else None,
            "relay_ratio": statistics.median(relay) if relay else None}


def timeouts(logs: Path) -> dict[str, int]:
    """How many times each kind of timeout fired, from every process's log (one line, one firing)."""
    patterns = [(kind, re.compile(p)) for kind, p in TIMEOUTS]
    out: Counter = Counter()
    for path in sorted(logs.glob("*.log")):
        if path.name.startswith(("proxy-", "redis")):
            continue
        for line in path.read_text(errors="replace").splitlines():
            if line[:1].isspace():  # a traceback's source lines (a timeout parameter named in code) fire nothing
                continue
            kind = next((k for k, p in patterns if p.search(line)), None)
            if kind:
                out[kind] += 1
    return dict(out)


def agent_reconnect_lines(logs: Path) -> int:
    return sum(len(RECONNECTING.findall(p.read_text(errors="replace"))) for p in logs.glob("agent-*.log"))


def wall(iso: str) -> float:
    return datetime.fromisoformat(iso.replace("Z", "+00:00")).timestamp()


def first_group(aof: Path, job_id: int, worker_id: int, *, after: float, min_version: int) -> float | None:
    """When (wall) ``worker_id`` first returned a group generated under ``min_version`` or newer after ``after``,
    from Redis' append-only file (the entry's id is the site's ms clock; its version is in the packed group)."""
    from dataplane.groupcodec import decode_group

    key, wid = f"echo2:job:{job_id}:trajectories".encode(), str(worker_id).encode()
    for cmd in fa.aof_commands(aof):
        if cmd[0].upper() != b"XADD" or cmd[1] != key:
            continue
        fields = dict(zip(cmd[3::2], cmd[4::2], strict=False))
        t = int(cmd[2].split(b"-")[0]) / 1000
        if t > after and fields.get(b"worker_id") == wid and decode_group(fields[b"data"]).version >= min_version:
            return t
    return None


def recovery(events: dict, records: list[dict], snapshots: list[dict], aof: Path, job_id: int,
             addresses: dict[str, str]) -> dict:
    """Seconds to recover from each fault (None: not within the run), from the fault script's events."""
    out: dict = {}
    if p := events.get("partition"):
        row = {"node": p.get("node", "-"), "partition_s": p.get("seconds"), "error": p.get("not_recovered")
               or p.get("error")}
        if "t_up" in p:
            address = next(a for a, n in addresses.items() if n == p["node"])
            back = [r["t"] for r in records if r["kind"] == "ws" and r["peer"] == address and r["t"] > p["t_up"]]
            row["reconnect_s"] = min(back) - p["t_up"] if back else None
            gen = first_group(aof, job_id, p["worker"], after=p["t_up"], min_version=p["version_at_up"]) \
                if aof.exists() else None
            row["generating_s"] = gen - p["t_up"] if gen else None
            row["version_at_up"] = p["version_at_up"]
            if row["error"]:
                row["last_seen"] = p.get("last_seen")
        out["partition"] = row
    if r := events.get("relay_down"):
        row = {"node": r.get("node", "-"), "child": r.get("child", "-"), "version": r.get("version"),
               "error": r.get("not_recovered") or r.get("not_repaired") or r.get("error"),
               "child_parent": r.get("child_parent")}
        if "t_kill" in r:
            row["killed_after_publication_s"] = r["t_kill"] - r["t_published"]
            row["repair_s"] = r["t_repaired"] - r["t_kill"] if "t_repaired" in r else None
            install = r.get("child_install")
            published = {s["version"]: wall(s["published_at"]) for s in snapshots}
            if install and install["version"] in published:
                row["child_installed_s"] = published[install["version"]] + install["seconds"] - r["t_kill"]
                row["child_version"] = install["version"]
        out["relay"] = row
    return out


def announce_latency(*, site_rtt_ms: float, learner_rtt_ms: float, agent_rtt_ms: float) -> float:
    """Seconds from publication until bytes flow, from the links alone: the site's message one way to an agent, and
    one round trip of its first hello to the learner."""
    return ((site_rtt_ms + agent_rtt_ms) / 2 + learner_rtt_ms + agent_rtt_ms) / 1000


def predicted_t_bcast(topology: Topology, strategy: str, *, size: float, chunk: float, gamma: float = 1.1) -> dict:
    """The simulator's T_bcast for these links (simulator/broadcast.py: the site's own planner, the flow-line
    chain or the max-min fair star) plus :func:`announce_latency`. Worker caps ``min(up, down)``, B0 the learner's
    uplink; nothing of the CPU, the engine's load or TCP beyond the rates is modelled."""
    from simulator.broadcast import install_times, plan_for, t_bcast, uplink

    bandwidth = {i + 1: min(a.up_mbit, a.down_mbit) * 1e6 / 8 for i, a in enumerate(topology.agents)}
    b0 = topology.learner.up_bps
    times = install_times(plan_for(strategy, bandwidth, b0_bps=b0), bandwidth, size=size, chunk=chunk,
                          b0_bps=uplink(strategy, b0))
    latency = announce_latency(site_rtt_ms=topology.site.rtt_ms, learner_rtt_ms=topology.learner.rtt_ms,
                               agent_rtt_ms=statistics.median(a.rtt_ms for a in topology.agents))
    return {"sim_t_bcast_s": t_bcast(times, q=1 / gamma) + latency, "sim_latency_s": latency,
            "sim_t_all_s": max(times.values()) + latency}

"""The topology in network namespaces: a core namespace holding a bridge, one namespace per node, a veth pair per
link (created inside the namespaces: nothing ever appears in the host's namespace), tc tbf for the rates, and each
link's round trip, jitter and loss either by tc netem (where the kernel has ``sch_netem``) or by our delay proxy
(bench/wan/proxy.py; ``emulation`` "netem" or "proxy", :func:`choose_emulation`).

With netem each direction of a link gets ``netem delay rtt/2 jitter loss`` as the root qdisc and the rate's tbf as
its child (``parent 1:1``): a packet is held for the link's delay on enqueue, and once due it enters tbf, which
paces it at the link's rate, so a packet's time on the link is its delay plus its queueing at the rate, as on a real
path (propagation, then the bottleneck's queue), and tbf keeps its own byte limit (with tbf as the root and netem
its child, tbf would see netem's packet limit instead and its ``latency`` bound would not hold). netem's ``limit``
holds at least two bandwidth-delay products of full-size packets, so the delay line never drops what the rate let
through.

Names carry the creating process's id (``e2w<pid>-``): a run removes its own on exit, on SIGINT/SIGTERM and at
interpreter exit; after a kill -9, ``python -m bench.wan down --all-mine`` removes every ``e2w`` namespace whose
creator is gone (and kills what still runs inside it, which only we started).
"""

from __future__ import annotations

import atexit
import contextlib
import math
import os
import re
import shutil
import signal
import subprocess
from dataclasses import dataclass, field

from .profile import Link, Topology

PREFIX = "e2w"
SUBNET = "10.77.0"
NAME = re.compile(rf"^{PREFIX}(\d+)-")


def prefix(pid: int | None = None) -> str:
    return f"{PREFIX}{pid or os.getpid()}-"


def ip(*args: str, check: bool = True) -> str:
    done = subprocess.run(("ip", *args), capture_output=True, text=True, timeout=30)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")
    return done.stdout


def unavailable() -> str | None:
    """Why namespaces cannot be built here (None: they can): not root, no ``ip`` or ``tc``, or ``ip netns add``
    refused."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return f"no `{tool}` on this machine (iproute2)"
    probe = f"{prefix()}probe"
    done = subprocess.run(("ip", "netns", "add", probe), capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        return f"`ip netns add` failed: {done.stderr.strip()}"
    subprocess.run(("ip", "netns", "del", probe), capture_output=True, timeout=30)
    return None


EMULATIONS = ("auto", "netem", "proxy")


def netem_unavailable() -> str | None:
    """Why tc netem cannot be used here (None: it can): a netem qdisc added on the loopback of a throwaway namespace
    of ours (removed at once) is refused (this machine's kernel has no ``sch_netem``: "Specified qdisc kind is
    unknown"), or namespaces themselves cannot be built."""
    reason = unavailable()
    if reason:
        return reason
    probe = f"{prefix()}netem-probe"
    ip("netns", "add", probe)
    try:
        done = subprocess.run(("ip", "netns", "exec", probe, "tc", "qdisc", "add", "dev", "lo", "root", "netem",
                               "delay", "1ms"), capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            return f"tc netem refused ({done.stderr.strip() or f'exit {done.returncode}'}): no sch_netem in this kernel"
        return None
    finally:
        ip("netns", "del", probe, check=False)


def choose_emulation(wanted: str = "auto") -> tuple[str, str]:
    """(emulation, why): ``auto`` is netem where the kernel has it, else the proxy; ``netem`` where it cannot be used
    raises ValueError with the reason; ``proxy`` is always possible."""
    if wanted not in EMULATIONS:
        raise ValueError(f"unknown link emulation {wanted!r} ({', '.join(EMULATIONS)})")
    if wanted == "proxy":
        return "proxy", "asked for"
    reason = netem_unavailable()
    if wanted == "netem" and reason:
        raise ValueError(f"--link-emulation netem: {reason}")
    if reason:
        return "proxy", reason
    return "netem", "the kernel has sch_netem"


def namespaces() -> list[str]:
    return [line.split()[0] for line in ip("netns", "list").splitlines() if line.strip()]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_namespace(name: str) -> None:
    """Kill what runs inside ``name`` (processes we started there) and delete it (its veths go with it)."""
    for pid in ip("netns", "pids", name, check=False).split():
        with contextlib.suppress(ProcessLookupError, ValueError):
            os.kill(int(pid), signal.SIGKILL)
    ip("netns", "del", name, check=False)


def down_all_mine(*, including_live: bool = False) -> list[str]:
    """Remove every namespace of ours whose creating process is gone (all of ours with ``including_live``)."""
    removed = []
    for name in namespaces():
        match = NAME.match(name)
        if match and (including_live or not _alive(int(match.group(1)))):
            remove_namespace(name)
            removed.append(name)
    return removed


def _tbf(mbit: float) -> list[str]:
    rate_bps = mbit * 1e6 / 8
    burst = max(int(rate_bps / 100), 32 * 1024)  # 10 ms of the rate, at least a GSO segment's worth
    return ["tbf", "rate", f"{mbit:g}mbit", "burst", str(burst), "latency", "50ms"]


def _netem(mbit: float, delay_ms: float, jitter_ms: float, loss: float) -> list[str]:
    """One direction of a link: half its round trip, uniform jitter of +- its jitter (netem's default without a
    distribution table), its loss; a limit of at least two bandwidth-delay products of 1514-byte packets."""
    bdp_packets = mbit * 1e6 / 8 * (delay_ms + jitter_ms) / 1000 / 1514
    argv = ["netem", "limit", str(max(1000, math.ceil(2 * bdp_packets))), "delay", f"{delay_ms:g}ms"]
    if jitter_ms:
        argv += [f"{jitter_ms:g}ms"]
    if loss:
        argv += ["loss", f"{100 * loss:g}%"]
    return argv


def link_qdiscs(ns: str, dev: str, mbit: float, link: Link, emulation: str) -> list[list[str]]:
    """The tc commands for one direction of ``link`` on ``dev`` in namespace ``ns`` (``mbit``: that direction's
    rate): tbf alone with the proxy emulating delay and loss; with netem, netem as the root (handle 1:) and tbf its
    child (``parent 1:1``; the module's docstring says why in this order)."""
    tc = ["ip", "netns", "exec", ns, "tc", "qdisc", "replace", "dev", dev]
    if emulation == "proxy":
        return [tc + ["root", *_tbf(mbit)]]
    if emulation != "netem":
        raise ValueError(f"unknown link emulation {emulation!r} (netem, proxy)")
    return [tc + ["root", "handle", "1:", *_netem(mbit, link.rtt_ms / 2, link.jitter_ms, link.loss)],
            tc + ["parent", "1:1", "handle", "10:", *_tbf(mbit)]]


@dataclass
class Net:
    """A topology built in namespaces; ``address(node)`` is the node's IP, ``exec(node)`` the argv prefix that runs
    a command inside its namespace. ``emulation``: "netem" puts each link's delay, jitter and loss in tc (the
    proxies then forward without delay), "proxy" leaves them to the proxies (tbf alone in tc)."""

    topology: Topology
    emulation: str = "proxy"  # who adds the links' delay, jitter and loss: "netem" (tc) or "proxy" (bench/wan/proxy.py)
    tag: str = field(default_factory=prefix)
    built: list[str] = field(default_factory=list)

    def ns(self, node: str) -> str:
        return f"{self.tag}{node}"

    def address(self, node: str) -> str:
        index = [n for n, _ in self.topology.nodes()].index(node)
        return f"{SUBNET}.{index + 10}"

    def exec(self, node: str) -> tuple[str, ...]:
        return ("ip", "netns", "exec", self.ns(node))

    def set_link(self, node: str, up: bool) -> None:
        """``node``'s eth0 down (its route goes with it: a partition, both ways) or up again (qdisc and address
        stay)."""
        ip("-n", self.ns(node), "link", "set", "eth0", "up" if up else "down")

    def links(self) -> dict[str, Link]:
        """IP -> link of every node (what each proxy needs to know about its peers)."""
        return {self.address(n): link for n, link in self.topology.nodes()}

    def up(self) -> Net:
        atexit.register(self.down)
        core = self.ns("core")
        self._add_ns(core)
        ip("-n", core, "link", "add", "br0", "type", "bridge")
        ip("-n", core, "link", "set", "br0", "up")
        for index, (node, link) in enumerate(self.topology.nodes()):
            ns, veth = self.ns(node), f"{self.tag[:-1]}v{index}"
            self._add_ns(ns)
            ip("-n", core, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
            ip("-n", core, "link", "set", veth, "master", "br0", "up")
            ip("-n", ns, "addr", "add", f"{self.address(node)}/24", "dev", "eth0")
            ip("-n", ns, "link", "set", "eth0", "up")
            for argv in (link_qdiscs(ns, "eth0", link.up_mbit, link, self.emulation)
                         + link_qdiscs(core, veth, link.down_mbit, link, self.emulation)):
                done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
                if done.returncode != 0:
                    raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip()}")
        return self

    def _add_ns(self, name: str) -> None:
        ip("netns", "add", name)
        self.built.append(name)
        ip("-n", name, "link", "set", "lo", "up")

    def down(self) -> None:
        for name in reversed(self.built):
            remove_namespace(name)
        self.built.clear()

    def __enter__(self) -> Net:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()


def on_signals_exit() -> None:
    """SIGTERM (and SIGHUP) exit through Python's normal path, so ``finally`` blocks and atexit tear down."""
    def _exit(signum, _frame):
        raise SystemExit(128 + signum)

    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _exit)

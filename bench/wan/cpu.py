"""CPU used by the stack's processes while a job runs on the WAN topology: is a broadcast slower than its
links allow because the machine has no core left for the relays?

A :class:`CpuSampler` thread reads, every ``interval`` seconds, the CPU time (utime + stime, ``/proc/<pid>/stat``)
of every process in each session the stack started (``echo2_site.demo.Stack`` starts each process in a session of
its own, so a process's children count with it) and the machine's busy time (``/proc/stat``: everything but idle
and iowait, other users of the machine included). :func:`window` turns two samples into cores used: per process,
per group (agents, proxies, learner, site) and the machine's, against ``os.cpu_count()``.

Only deltas between samples of the same pid are summed, so a process that exits loses nothing it used before.
"""

from __future__ import annotations

import bisect
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path

HZ = os.sysconf("SC_CLK_TCK")
GROUPS = (("agents", "agent-"), ("proxies", "proxy-"), ("learner", "learner"), ("load", "load-"), ("site", ""))


def group_of(name: str) -> str:
    """The group a stack process counts in: agents, proxies, learner, a synthetic load (bench/wan/burn.py), or the
    site (daphne, celery, redis...)."""
    return next(group for group, prefix in GROUPS if name.startswith(prefix))


def machine_ticks(stat: Path = Path("/proc/stat")) -> tuple[int, int]:
    """(busy, total) clock ticks of all cores since boot: busy is all but idle and iowait."""
    fields = [int(x) for x in stat.read_text().split("\n", 1)[0].split()[1:]]
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    total = sum(fields[:8])  # guest time is already in user
    return total - idle, total


def process_ticks(proc: Path = Path("/proc")) -> dict[int, tuple[int, int]]:
    """pid -> (session id, utime + stime ticks) of every process readable now."""
    out = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            text = (entry / "stat").read_text()
        except OSError:  # gone between listing and reading
            continue
        rest = text[text.rfind(")") + 2:].split()  # the name may hold spaces and parentheses
        out[int(entry.name)] = (int(rest[3]), int(rest[11]) + int(rest[12]))
    return out


class CpuSampler:
    """Samples until :meth:`stop`: ``samples`` holds (wall time, machine busy s, machine total s, {name: cpu s}),
    cumulative since :meth:`start`. ``sessions()`` gives the sessions to follow now: session id -> name."""

    def __init__(self, sessions: Callable[[], dict[int, str]], interval: float = 0.5) -> None:
        self.sessions, self.interval = sessions, interval
        self.samples: list[tuple[float, float, float, dict[str, float]]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="cpu-sampler", daemon=True)

    def start(self) -> CpuSampler:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        last: dict[int, int] = {}
        used: dict[str, float] = {}
        busy0, total0 = machine_ticks()
        while True:
            names = self.sessions()
            now, (busy, total) = time.time(), machine_ticks()
            seen = {}
            for pid, (session, ticks) in process_ticks().items():
                name = names.get(session)
                if name is None:
                    continue
                seen[pid] = ticks
                if pid in last:  # a pid first seen counts from its next sample: its past is not in any window
                    used[name] = used.get(name, 0.0) + max(0, ticks - last[pid]) / HZ
                else:
                    used.setdefault(name, 0.0)
            last = seen
            self.samples.append((now, (busy - busy0) / HZ, (total - total0) / HZ, dict(used)))
            if self._stop.wait(self.interval):
                return


def window(samples: list[tuple[float, float, float, dict[str, float]]], t0: float, t1: float) -> dict | None:
    """Cores used between wall times ``t0`` and ``t1`` (the samples nearest outside them): per process
    (``procs``), per group (``groups``), the stack's sum, the machine's (everyone's), and the machine's busy
    fraction of its ``cores``. None if fewer than two samples bound the window."""
    times = [s[0] for s in samples]
    i, j = max(0, bisect.bisect_right(times, t0) - 1), min(len(samples) - 1, bisect.bisect_left(times, t1))
    if j <= i:
        return None
    (a, busy_a, total_a, used_a), (b, busy_b, total_b, used_b) = samples[i], samples[j]
    seconds = b - a
    procs = {name: (used_b[name] - used_a.get(name, 0.0)) / seconds for name in used_b}
    groups: dict[str, float] = {}
    for name, cores in procs.items():
        groups[group_of(name)] = groups.get(group_of(name), 0.0) + cores
    cores = os.cpu_count() or 1
    machine = (busy_b - busy_a) / seconds
    return {"t0": a, "t1": b, "seconds": seconds, "procs": procs, "groups": groups, "stack": sum(procs.values()),
            "machine": machine, "cores": cores, "busy": (busy_b - busy_a) / max(total_b - total_a, 1e-9)}


def stack_sessions(procs: list) -> Callable[[], dict[int, str]]:
    """For :class:`CpuSampler`: the sessions of a ``Stack``'s processes (a started process leads its own)."""
    return lambda: {proc.pid: name for name, proc in list(procs)}

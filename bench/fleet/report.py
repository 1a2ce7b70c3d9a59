"""Figures of one fleet-bench row, from the agents' frame events (:mod:`bench.fleet.probe`) and the site's
records: pure functions over plain data."""

from __future__ import annotations

import bisect
import math
import re
from collections import Counter

ON_TIME_S = 1.0  # a heartbeat handled within this long of its sending is on time
_STEP = re.compile(r"step \d+ .*? t_train=([\d.]+)s wait=([\d.]+)s")


def merge(summaries: list[dict]) -> dict:
    """One summary for the fleet, from each agent process's."""
    out: dict = {"sent": Counter(), "received": Counter(), "replies": [], "rejections": [], "heartbeats": {},
                 "welcomed": {}, "pushes": {}, "snapshots": {}, "leased": {}, "accepted": set(), "handed_back": set(),
                 "refused_groups": set(), "unanswered": [], "generated_groups": 0}
    for s in summaries:
        out["sent"].update(s["sent"])
        out["received"].update(s["received"])
        for key in ("replies", "rejections", "unanswered"):
            out[key].extend(s[key])
        for key in ("heartbeats", "welcomed", "leased"):
            out[key].update(s[key])
        for key in ("accepted", "handed_back", "refused_groups"):
            out[key].update(s[key])
        for kind, by_worker in s["pushes"].items():
            out["pushes"].setdefault(kind, {}).update(by_worker)
        for version, by_worker in s["snapshots"].items():
            out["snapshots"].setdefault(int(version), {}).update(by_worker)
        out["generated_groups"] += s["generated_groups"]
    return out


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q / 100 * len(ordered)) - 1))]


def heartbeat_lags(sent: dict[str, list[float]], handled: dict[int, list[float]], start: float,
                   end: float) -> dict:
    """Heartbeats sent in [start, end) paired, in order, with the site's handling times of the same worker (a
    socket's frames are handled in order: each handled time belongs to the earliest heartbeat not yet paired and
    sent before it). ``on_time``: handled within :data:`ON_TIME_S`."""
    lags, unhandled, total = [], 0, 0
    for worker, times in sent.items():
        done = sorted(handled.get(int(worker), []))
        j = 0
        for t in sorted(times):
            j = bisect.bisect_left(done, t - 0.05, lo=j)  # clocks of one machine; 50 ms of slack for rounding
            if not start <= t < end:
                j += j < len(done)
                continue
            total += 1
            if j < len(done):
                lags.append(max(0.0, done[j] - t))
                j += 1
            else:
                unhandled += 1
    on_time = sum(1 for lag in lags if lag <= ON_TIME_S)
    return {"sent": total, "on_time": on_time, "unhandled": unhandled, "p50": pct(lags, 50), "p99": pct(lags, 99)}


def reply_latencies(replies: list, start: float, end: float) -> dict[str, tuple[float | None, float | None, int]]:
    """p50, p99 and count of reply latency per request type, for requests sent in [start, end)."""
    by_type: dict[str, list[float]] = {}
    for kind, sent_at, latency, _reply in replies:
        if start <= sent_at < end:
            by_type.setdefault(kind, []).append(latency)
    return {k: (pct(v, 50), pct(v, 99), len(v)) for k, v in by_type.items()}


def messages_in(fleet: dict, start: float, end: float) -> int:
    """Frames the agents sent in [start, end): heartbeats and requests (those with an id)."""
    beats = sum(1 for ts in fleet["heartbeats"].values() for t in ts if start <= t < end)
    requests = sum(1 for _, t, _, _ in fleet["replies"] if start <= t < end)
    requests += sum(1 for _, _, t in fleet["unanswered"] if start <= t < end)
    return beats + requests


def push_spread(times: dict[str, list[float]] | dict[str, float], since: float) -> tuple[int, float | None]:
    """How many workers got the push after ``since``, and seconds from ``since`` to the last of them."""
    firsts = []
    for value in times.values():
        later = [t for t in (value if isinstance(value, list) else [value]) if t >= since]
        if later:
            firsts.append(min(later))
    return len(firsts), (max(firsts) - since if firsts else None)


def snapshot_fanout(snapshots: dict[int, dict[str, float]], start: float, end: float) -> dict:
    """Versions first noticed in [start, end): workers told, and first-to-last notice spread (median, worst)."""
    spreads, told = [], []
    for by_worker in snapshots.values():
        times = sorted(by_worker.values())
        if times and start <= times[0] < end:
            spreads.append(times[-1] - times[0])
            told.append(len(times))
    return {"versions": len(spreads), "told_min": min(told, default=0), "spread_p50": pct(spreads, 50),
            "spread_max": max(spreads, default=None)}


def lost_groups(fleet: dict, *, before: float) -> int:
    """Leases that came before ``before`` (at least the reply timeout before the release) whose group was never
    accepted, handed back, nor refused for its content: work the transport lost."""
    done = fleet["accepted"] | fleet["handed_back"] | fleet["refused_groups"]
    return sum(1 for lease, t in fleet["leased"].items() if t < before and lease not in done)


def leased_before(fleet: dict, *, before: float) -> int:
    """Leases that came before ``before``: the ones :func:`lost_groups` can judge (a later one may be mid-retry)."""
    return sum(1 for t in fleet["leased"].values() if t < before)


def learner_bubble(log_text: str) -> tuple[float | None, int]:
    """Share of the learner's step time spent waiting for data (``wait=`` over ``wait`` plus ``t_train``) in
    the log lines given, and how many steps they are."""
    waits = [(float(train), float(wait)) for train, wait in _STEP.findall(log_text)]
    total = sum(t + w for t, w in waits)
    return (sum(w for _, w in waits) / total if total else None), len(waits)


def refusals(rejections: list, start: float, end: float) -> Counter:
    """Refusals received in [start, end), by (refused type, reason's first words)."""
    return Counter((kind, " ".join(reason.split()[:5])) for t, kind, reason in rejections if start <= t < end)

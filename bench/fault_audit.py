"""Accounting and report of ``bench/bench_faults.py``: functions over what a fault run recorded.

No processes and no network here: the bench hands in the learner's final step reports, the site's summary,
its own samples of the summary over time, the step lines it saw in the learner's log, and the private Redis'
append-only file; these functions turn them into one table row and its pass/fail line.
"""

from __future__ import annotations

import re
import shutil
import statistics
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

STREAM_ID = re.compile(rb"^\d+-\d+$")


@dataclass
class Sample:
    """One poll of the site while the job ran (seconds since the run's start)."""

    t: float
    status: str
    step: int
    accepted_records: int
    active: list[int]
    cost_usd: float


@dataclass
class StreamAudit:
    """The job's trajectory stream replayed from Redis' append-only file."""

    added: set[bytes] = field(default_factory=set)
    deleted: set[bytes] = field(default_factory=set)
    leftover: int = 0  # entries still in the stream when the site dropped it (or at the end of the file)


class LogTail:
    """New lines of the learner's log, stamped with the bench's clock when seen: its steps and restarts."""

    STEP, READY = re.compile(r"\bstep (\d+) reward="), re.compile(r"resumed at v\d+|fresh start")

    def __init__(self, path: Path, *, from_end: bool = False) -> None:
        """``from_end``: only lines written from now on (a restarted process appending to its old log)."""
        self.path, self.rest = path, b""
        self.pos = path.stat().st_size if from_end and path.exists() else 0
        self.steps: list[tuple[float, int]] = []
        self.ready: list[float] = []

    def poll(self, t: float) -> None:
        if not self.path.exists():
            return
        with self.path.open("rb") as fh:
            fh.seek(self.pos)
            data = self.rest + fh.read()
            self.pos = fh.tell()
        *lines, self.rest = data.split(b"\n")
        for line in lines:
            text = line.decode(errors="replace")
            if m := self.STEP.search(text):
                self.steps.append((t, int(m.group(1))))
            if self.READY.search(text):
                self.ready.append(t)


def aof_commands(directory: Path) -> Iterator[list[bytes]]:
    """Every command of a Redis 7 multi-part append-only file, oldest first (the incremental files named by
    its manifest; the bench turns automatic rewrites off, so the base file holds nothing of the job). A tail
    cut short by a SIGKILL ends its file."""
    manifest = (directory / "appendonly.aof.manifest").read_text().split("\n")
    for line in manifest:
        parts = line.split()
        if len(parts) >= 6 and parts[-1] == "i":
            yield from _resp(directory / parts[1])


def _resp(path: Path) -> Iterator[list[bytes]]:
    data, pos = path.read_bytes(), 0
    while data.startswith(b"*", pos):
        end = data.find(b"\r\n", pos)
        count, pos, args = int(data[pos + 1:end]), end + 2, []
        for _ in range(count):
            end = data.find(b"\r\n", pos)
            if end < 0 or not data.startswith(b"$", pos):
                return
            size = int(data[pos + 1:end])
            args.append(data[end + 2:end + 2 + size])
            pos = end + 4 + size
        if pos > len(data):
            return
        yield args


def stream_audit(commands: Iterable[list[bytes]], key: str) -> StreamAudit:
    """Which entries were appended to stream ``key``, which deleted, and how many were left when it was
    dropped. Redis writes XADD with the id it generated, so ids match the learner's ``extra.entries``."""
    out, live, name, dropped = StreamAudit(), set(), key.encode(), False
    for args in commands:
        cmd = args[0].upper()
        if len(args) < 2 or args[1] != name:
            continue
        if cmd == b"XADD":
            entry = next((a for a in args[2:] if STREAM_ID.match(a)), None)
            if entry is not None:
                out.added.add(entry)
                live.add(entry)
        elif cmd == b"XDEL":
            out.deleted.update(args[2:])
            live.difference_update(args[2:])
        elif cmd in (b"DEL", b"UNLINK") and not dropped:
            out.leftover, dropped = len(live), True
            live.clear()
    if not dropped:
        out.leftover = len(live)
    return out


class AgentLogTail(LogTail):
    """An agent's log: ready once it installed a snapshot (its engine built, weights loaded: it can generate)."""

    STEP, READY = re.compile(r"(?!)"), re.compile(r"installed snapshot v\d+ of job")


def first_after(times: list[float], t: float) -> float | None:
    """The first of ``times`` after ``t``."""
    return next((at for at in times if at > t), None)


def step_recovery(tail: LogTail, t: float, *, restarted: bool) -> float | None:
    """Seconds from the fault at ``t`` to the learner's next step. With ``restarted`` (the learner was killed), the
    restarted learner's: a line the killed one wrote just before it died may be read (and stamped) after ``t``."""
    since = (first_after(tail.ready, t) or t) if restarted else t
    step = first_after([at for at, _ in tail.steps], since)
    return None if step is None else step - t


def step_period(steps: list[tuple[float, int]], before: float) -> float | None:
    """Seconds per learner step before ``before``: the steps' span over their count. Lines are stamped when a
    poll sees them (twice a second) and a poll often sees several steps, so the gaps between stamps (mostly 0)
    say nothing of one step's length."""
    seen = [(at, step) for at, step in steps if at <= before]
    if len(seen) < 2 or seen[-1][1] <= seen[0][1]:
        return None
    return (seen[-1][0] - seen[0][0]) / (seen[-1][1] - seen[0][1])


def throughput_back(samples: list[Sample], t: float, *, window: float = 5.0, before: float = 15.0,
                    share: float = 0.9) -> tuple[float | None, float | None]:
    """(seconds, level): the start of the first ``window``-second stretch after ``t`` in which the pool
    delivered at least ``share`` of its rate over the ``before`` seconds before ``t`` (records accepted per
    second, from the site's counters); None when that never happened while the job was running."""
    running = [s for s in samples if s.status == "running"]
    pre = [s for s in running if t - before <= s.t <= t and s.accepted_records > 0]  # not the start-up
    if len(pre) < 2 or pre[-1].t <= pre[0].t:
        return None, None
    level = (pre[-1].accepted_records - pre[0].accepted_records) / (pre[-1].t - pre[0].t)
    after = [s for s in running if s.t >= t]
    for i, start in enumerate(after):
        end = next((s for s in after[i:] if s.t >= start.t + window), None)
        if end is None:
            return None, level
        if (end.accepted_records - start.accepted_records) / (end.t - start.t) >= share * level:
            return start.t - t, level
    return None, level


def billed_while(samples: list[Sample], worker: int, start: float, end: float) -> float:
    """Worker-seconds ``worker`` was active (billed) in the job between ``start`` and ``end``."""
    inside = [s for s in samples if start <= s.t <= end]
    return sum(b.t - a.t for a, b in zip(inside, inside[1:], strict=False) if worker in a.active)


def audit(metrics: list[dict], summary: dict, stream: StreamAudit | None, group_size: int) -> dict:
    """Records accepted, trained, dropped stale, lost and trained twice; max staleness; bubble.

    ``metrics`` are the final step reports (a restarted learner's re-trained step replaced the lost one's),
    so an entry id in two of them was trained twice into the model. Lost = accepted groups neither trained,
    nor dropped stale, nor quarantined, nor still in the stream at the end."""
    counters = summary.get("counters") or {}
    ids = Counter(e for m in metrics for e in (m.get("extra") or {}).get("entries", []))
    trained = sum(sum((m.get("extra") or {}).get("staleness_histogram", {}).values()) or
                  len((m.get("extra") or {}).get("entries", [])) * group_size for m in metrics)
    dropped = int(summary.get("dropped_stale") or 0)
    leftover = stream.leftover if stream else 0
    quarantined = int(counters.get("quarantined_records", 0))  # learner/quarantine.py: deliberately not trained
    lost_groups = (int(counters.get("accepted_groups", 0)) - len(ids) - dropped // group_size - leftover
                   - quarantined // group_size)
    bubbles = [m["wait_s"] / (m["wait_s"] + m["t_train"]) for m in metrics if m["wait_s"] + m["t_train"] > 0]
    out = {"accepted": int(counters.get("accepted_records", 0)), "accepted_groups": int(counters.get(
        "accepted_groups", 0)), "trained": trained, "dropped_stale": dropped, "leftover_groups": leftover,
        "lost": lost_groups * group_size, "trained_twice": sum(n - 1 for n in ids.values() if n > 1) * group_size,
        "max_staleness": max((m["max_staleness"] for m in metrics), default=None),
        "bubble": statistics.fmean(bubbles) if bubbles else None, "notes": []}
    steps = sorted(m["step"] for m in metrics)
    missing = sorted(set(range(1, steps[-1] + 1)) - set(steps)) if steps else []
    if missing:
        out["notes"].append(f"no report for step(s) {_short(missing)}: their groups count as lost")
    if quarantined:
        out["notes"].append(f"{quarantined} records quarantined by the learner (not lost, not trained)")
    if stream is not None:
        untrained = len(stream.deleted - {e.encode() for e in ids})
        if len(stream.added) != out["accepted_groups"]:
            out["notes"].append(f"Redis appended {len(stream.added)} groups, the counters say "
                                f"{out['accepted_groups']}")
        if untrained != dropped // group_size:
            out["notes"].append(f"{untrained} groups were deleted from the stream untrained, "
                                f"{dropped // group_size} reported dropped stale")
    return out


def _short(values: list[int]) -> str:
    return ", ".join(map(str, values[:8])) + (f" (+{len(values) - 8})" if len(values) > 8 else "")


def criteria(row: dict, staleness: int) -> list[str]:
    """Issue 13's pass criteria for one row: the reasons it fails (empty: it passes)."""
    if row["fault"] == "none":
        checks = []
    else:
        allowed, pool = row.get("allowed_s"), row.get("allowed_pool_s", row.get("allowed_s"))
        checks = [(row["step_s"] is not None and allowed is not None and row["step_s"] <= allowed,
                   f"next step after {_secs(row['step_s'])} > {_secs(allowed)} allowed"),
                  (row["pool_s"] is not None and pool is not None and row["pool_s"] <= pool,
                   f"pool throughput back after {_secs(row['pool_s'])} > {_secs(pool)} allowed" if pool is not None
                   else "no bound on the pool's recovery: the restarted component was never seen running")]
    checks = [(row["completed"], f"job {row['status']}"
               + (f" ({row['status_reason']})" if row.get("status_reason") else "")),
              (row["lost"] in (0, None), f"{row['lost']} records lost"),  # None: unknown, the job had not ended
              (row["trained_twice"] == 0, f"{row['trained_twice']} records trained twice"),
              (row["max_staleness"] is not None and row["max_staleness"] <= staleness,
               f"max staleness {row['max_staleness']} > S={staleness}"), *checks]
    bills = row.get("bills")
    if bills is not None:
        checks += [(bills["billed_closed"] <= BILL_TOLERANCE_S,
                    f"{bills['billed_closed']:.1f} worker-seconds billed with the socket closed"),
                   (bills["billed_stalled"] <= bills["held_stalled"] + BILL_TOLERANCE_S,
                    f"{bills['billed_stalled']:.1f} worker-seconds billed while the job could not progress, "
                    f"{bills['held_stalled']:.1f} of them held a lease"),
                   (all(abs(d) <= BILL_TOLERANCE_S for d in bills["per_worker"].values()),
                    f"billed {bills['billed']:.1f} worker-seconds, leases held {bills['held']:.1f} (billed - held "
                    f"per worker: {', '.join(f'{d:+.1f}' for d in bills['per_worker'].values())})")]
    if row.get("injected_at") is None and row["fault"] != "none":
        checks.append((False, "the fault was never injected"))
    return [why for ok, why in checks if not ok]


BILL_TOLERANCE_S = 1.0  # seconds per worker: its bill equal to its lease-held time to the second (issue 44)


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.1f} s"


# ---- the report ------------------------------------------------------------------------------------------


def _fmt(value, spec: str = ".1f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def table(rows: list[dict], title: str):
    """The rich table: one row per run; the bubble column against the baseline's (``none``) row."""
    from rich.table import Table

    out = Table(title=title)
    for name in ("fault", "completed", "recovery s\nstep / pool", "accepted", "trained", "dropped\nstale", "lost",
                 "trained\ntwice", "max\nlag", "bubble\n+pp", "billed\ndiscarded w-s", "billed / held\nw-s",
                 "over / under\nw-s", "closed / stalled\nbilled w-s"):
        out.add_column(name, justify="left" if name in ("fault", "completed") else "right")
    base = next((r["bubble"] for r in rows if r["fault"] == "none"), None)
    for r in rows:
        done = "yes" if r["completed"] else f"no ({r['status']}: {r['status_reason'][:50]})"
        recovery = "-" if r["fault"] == "none" else \
            f"{_fmt(r['step_s'], none='never')} / {_fmt(r['pool_s'], none='never')}"
        bubble = "n/a" if base is None or r["bubble"] is None else f"{100 * (r['bubble'] - base):+.1f}"
        billed = "n/a" if r["billed_discarded_ws"] is None else f"{r['billed_discarded_ws']:.0f}"
        b = r.get("bills")
        bills = ("-", "-", "-") if b is None else (
            f"{b['billed']:.1f} / {b['held']:.1f}", f"{b['over']:.1f} / {b['under']:.1f}",
            f"{b['billed_closed']:.1f} / {b['billed_stalled']:.1f}")
        out.add_row(r["fault"], done, recovery, str(r["accepted"]), str(r["trained"]), str(r["dropped_stale"]),
                    _fmt(r["lost"], "d", "n/a"), str(r["trained_twice"]), _fmt(r["max_staleness"], "d"), bubble,
                    billed, *bills)
    return out


def verdicts(rows: list[dict], console, staleness: int, detect: dict[str, str],
             detect_pool: dict[str, str] | None = None) -> int:
    """Print the pass criteria per row, PASS or FAIL with the reasons and notes, and the overall line;
    each row gets its ``failures``. Returns how many rows pass."""
    console.print("Pass criteria (issue 13): the job completes, 0 lost, 0 trained twice, max staleness <= S, "
                  "and recovery (next step and pool throughput) within one training step plus the timeout that "
                  "detects the fault.")
    passed = 0
    for r in rows:
        r["failures"] = criteria(r, staleness)
        passed += not r["failures"]
        allowed = "" if r["fault"] == "none" else \
            f"  [dim](allowed {_fmt(r['allowed_s'])} s: one step + {detect[r['fault']]})[/dim]"
        if r["fault"] in (detect_pool or {}):
            allowed = allowed.replace(")[/dim]", f"; pool {_fmt(r.get('allowed_pool_s'))} s: one step + "
                                                 f"{detect_pool[r['fault']]})[/dim]")
        verdict = "[green]PASS[/green]" if not r["failures"] else "[red]FAIL[/red]: " + "; ".join(r["failures"])
        console.print(f"  {r['fault']:<14} {verdict}{allowed}")
        for note in r["notes"]:
            console.print(f"  {'':<14} [dim]note: {note}[/dim]")
    color = "green" if passed == len(rows) else "red"
    console.print(f"[{color}]overall: {passed}/{len(rows)} rows pass[/{color}]")
    return passed


def tidy(workdir: Path, rows: list[dict], keep: bool) -> None:
    """Without --keep-logs, remove everything but the logs of failing rows."""
    if keep:
        return
    failing = {r["fault"] for r in rows if r.get("failures")}
    for path in workdir.iterdir():
        name = path.name.removeprefix("run-")
        if path.name.startswith("run-") and name in failing:
            for part in path.iterdir():
                if part.name != "logs":
                    shutil.rmtree(part) if part.is_dir() else part.unlink()
        else:
            shutil.rmtree(path) if path.is_dir() else path.unlink()

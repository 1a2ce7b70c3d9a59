"""The fleet bench's printed tables: one column per row (N agents x site processes), one line per figure, and the
first limit the rows met, in words."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .rows import Row


def _fmt(value, spec: str = ".2f", none: str = "-") -> str:
    return none if value is None else format(value, spec)


def table(rows: list[Row], title: str = "fleet bench"):
    """One column per row of the bench (N agents x site processes), one line per figure."""
    from rich.table import Table

    t = Table(title=title)
    t.add_column("figure")
    for row in rows:
        t.add_column(f"{row.figures['agents']} x {row.figures['site_processes']}", justify="right")
    for label, show in FIGURES:
        t.add_row(label, *(_safe(show, row.figures) for row in rows))
    return t


def markdown(rows: list[Row]) -> str:
    """The table of :func:`table` in Markdown (docs/fleet.md)."""
    head = ["figure", *(f"{r.figures['agents']} x {r.figures['site_processes']}" for r in rows)]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for label, show in FIGURES:
        cells = [label, *(_safe(show, r.figures).replace("|", "/") for r in rows)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _safe(show, figures: dict) -> str:
    try:
        return show(figures)
    except (KeyError, TypeError, ZeroDivisionError):
        return "-"


def _share(hb: dict) -> str:
    return f"{hb['on_time'] / hb['sent']:.0%} of {hb['sent']}" if hb["sent"] else "-"


def _lag(hb: dict) -> str:
    return f"{_fmt(hb['p50'], '.3f')} / {_fmt(hb['p99'], '.3f')}" + (f" ({hb['unhandled']} never)"
                                                                      if hb["unhandled"] else "")


def _latencies(f: dict) -> str:
    return "; ".join(f"{kind} {_fmt(p50, '.3f')} / {_fmt(p99, '.3f')}" for kind, (p50, p99, n) in
                     sorted(f["latency"].items()) if kind in ("lease_request", "trajectories", "submit")) or "-"


FIGURES = [
    ("agents connected (s to the last)", lambda f: f"{f['connected']} ({_fmt(f['connect_s'], '.1f')})"),
    ("heartbeats on time, idle", lambda f: _share(f["hb_idle"])),
    ("heartbeats on time, generating", lambda f: _share(f["hb_gen"])),
    ("heartbeats on time /s, generating", lambda f: _fmt(f["hb_on_time_per_s"], ".0f")),
    ("heartbeat p50 / p99 s, idle", lambda f: _lag(f["hb_idle"])),
    ("heartbeat p50 / p99 s, generating", lambda f: _lag(f["hb_gen"])),
    ("groups/s accepted (engines' top speed)", lambda f: f"{f['groups_per_s']:.0f} ({f['engine_groups_per_s']:.0f})"),
    ("records/s accepted", lambda f: f"{f['records_per_s']:.0f}"),
    ("groups the drain acknowledged", lambda f: "off (--no-drain)" if "drained" not in f else f"{f['drained']}"
     if f["drain_error"] == "None" else f"failed: {f['drain_error'][:60]}"),
    ("lease requests answered no_work", lambda f: str(no_work(f))),
    ("agent messages/s", lambda f: f"{f['messages_per_s']:.0f}"),
    ("refused (rejected replies)", lambda f: f"{f['refused']}" + (f" {f['refused_why']}" if f["refused"] else "")),
    ("refused over budget (site's count)", lambda f: _fmt(f.get("site_refused"), "d", "not counted")),
    # the site's log line for a lowered budget is at INFO, which a bench's daphne does not print: count the frames
    ("welcomes past one per agent (a lower budget, or a reconnect)",
     lambda f: str(f.get("frames_received", {}).get("welcome", 0) - f["connected"])),
    ("groups lost", lambda f: f"{f['lost']} of {f['leases']} leased" if "lost_checked" not in f else
     f"{f['lost']} of {f['lost_checked']} leased {f['lost_cutoff_s']:g} s before the release ({f['leases']} in all)"),
    ("reply p50 / p99 s", _latencies),
    ("base installed by all: s after assigns", lambda f: _fmt(f["base_installed_s"], ".1f", "not all in 240 s")),
    ("first group accepted: s after that (the window opens 2 s later)",
     lambda f: _fmt(f.get("first_group_s"), ".1f", "none in 60 s")),
    ("activate: s to last assign", lambda f: f"{_fmt(f['activate_s'], '.1f')} ({f['activate_told']})"),
    ("release: s to last release", lambda f: f"{_fmt(f['release_s'], '.1f')} ({f['release_told']})"
     + (f"; cancel answered {f['cancel_errors']} first" if f["cancel_errors"] else "")),
    ("re-plan (job_replan) s", lambda f: _fmt(f["replan_s"], ".3f")),
    ("snapshot push, first to last agent s", lambda f: f"{_fmt(f['push']['spread_p50'], '.2f')} (max "
                                                        f"{_fmt(f['push']['spread_max'], '.2f')}, "
                                                        f"{f['push']['versions']} versions)"),
    ("site CPU ms / message (core share)", lambda f: f"{_fmt(f['cpu_ms_per_msg'])} ({f['daphne_cpu_share']:.0%})"),
    ("site CPU ms / group accepted", lambda f: _fmt(f["cpu_ms_per_group"])),
    ("idle: site CPU ms / DB xact per heartbeat", lambda f: f"{_fmt(f['idle_cpu_ms_per_hb'])} / "
                                                            f"{_fmt(f['idle_xact_per_hb'], '.2f', 'n/a')}"),
    ("machine CPU busy (all cores, everyone's)", lambda f: f"{f['machine_busy']:.0%} of {os.cpu_count()} cores"),
    ("the emulated fleet's own CPU (cores)", lambda f: f"{f['fleet_cpu_share']:.2f}"),
    ("DB transactions / message", lambda f: _fmt(f.get("db_xact_per_msg"), ".2f", "n/a (sqlite)")),
    ("DB rows / message", lambda f: _fmt(f.get("db_rows_per_msg"), ".1f", "n/a (sqlite)")),
    ("learner bubble (steps)", lambda f: f"{_fmt(f['bubble'], '.0%')} ({f['learner_steps']})"),
]


def first_limit(rows: list[Row]) -> str:
    """Where the first limit is, from the smallest fleet up, the figure that shows it, and why."""
    for row in sorted(rows, key=lambda r: (r.figures["site_processes"], r.figures["agents"])):
        f, name = row.figures, f"{row.figures['agents']} agents on {row.figures['site_processes']} process(es)"
        hb = f.get("hb_gen") or {}
        offered, taken = f.get("engine_groups_per_s") or 0, f.get("groups_per_s") or 0
        if f.get("connected", 0) < f["agents"]:
            found = f"only {f.get('connected')} connected"
        elif hb.get("sent") and hb["on_time"] / hb["sent"] < 0.99:
            found = (f"{hb['on_time'] / hb['sent']:.0%} of heartbeats handled within 1 s while generating (p99 "
                     f"{_fmt(hb['p99'])} s)")
        elif f.get("refused"):
            found = f"{f['refused']} messages refused ({f.get('refused_why')})"
        elif f.get("lost"):
            found = f"{f['lost']} groups lost"
        elif f.get("activate_told", f["agents"]) < f["agents"]:
            found = f"only {f['activate_told']} of {f['agents']} agents got their assignment"
        elif offered and taken < 0.8 * offered and no_work(f) and "drained" not in f:
            return (f"first limit: {name}: the learner's prompts: the site accepted {taken:.0f} groups/s of the "
                    f"{offered:.0f} the engines could generate and answered {no_work(f)} lease requests no_work; the "
                    "learner keeps only 2 x (groups per step) prompt groups outstanding, so its training speed "
                    "bounds ingest (--drain measures the site's ceiling)")
        elif offered and taken < 0.8 * offered:
            found = f"the site accepted {taken:.0f} groups/s of the {offered:.0f} the engines could generate"
        else:
            continue
        return f"first limit: {name}: {found}. {_why(f)}"
    return "no limit met at these sizes (every heartbeat on time, nothing refused or lost, all groups accepted)"


def no_work(f: dict) -> int:
    received = f.get("frames_received", {})
    return received.get("no_work (in submitted)", 0) + received.get("no_work", 0)


def _why(f: dict) -> str:
    """CPU-bound or waiting: the site's CPU per message against what its processes got."""
    cpu_ms, rate, share = f.get("cpu_ms_per_msg"), f.get("messages_per_s"), f.get("daphne_cpu_share")
    if not cpu_ms or not rate or share is None:
        return ""
    need = cpu_ms * rate / 1000 / f["site_processes"]
    busy = f.get("machine_busy") or 0
    per_core = 1000 / cpu_ms
    agents = per_core / (rate / f["agents"])
    text = (f"Why: each site process spent {cpu_ms:.2f} ms of CPU per agent message, {need:.2f} of a core at "
            f"{rate:.0f} messages/s, and got {share:.0%} of a core with the machine {busy:.0%} busy")
    scale = (f"; one core at this cost handles ~{per_core:.0f} messages/s, ~{agents:.0f} agents at this fleet's "
             f"{rate / f['agents']:.2f} messages per agent-second. A socket's frames are handled in order, so a "
             "backlog delays heartbeats, replies and pushes alike.")
    if share >= 0.7:
        return (text + ": the site process is at its ceiling (its handlers' threads share one interpreter lock: one "
                "process uses at most one core, less under lock contention)" + scale)
    if busy >= 0.85:
        return text + ": the site is CPU-bound at its share of this (saturated) machine" + scale
    return text + ": not CPU-bound; its messages wait (the database thread, Redis, the event loop's queue)."

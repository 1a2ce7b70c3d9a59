"""What the owner CLI prints for people: pure functions from the API's JSON to text or rich tables (``--json``
prints the API's JSON itself)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from dataplane.learner_command import TOKEN_FILE, learner_command

if TYPE_CHECKING:  # rich loads when something is drawn, not for `echo2 --help`
    from rich.console import Group
    from rich.table import Table

TERMINAL = frozenset({"completed", "failed", "cancelled"})
"""The statuses a job does not leave by itself: ``watch`` and ``logs --follow`` stop there. (A failed job can be
resumed, but only by its owner.)"""


def fmt(value: float | int | None, digits: int = 3, unit: str = "") -> str:
    """A figure for people: ``-`` while unknown."""
    if value is None:
        return "-"
    text = f"{value:.{digits}f}" if isinstance(value, float) else str(value)
    return text + unit


def job_line(job: dict) -> str:
    """One job in a sentence: what ``submit``, ``pause``, ``resume`` and ``cancel`` print."""
    reason = f" ({job['status_reason']})" if job.get("status_reason") else ""
    return f"job {job['id']} {job['name']!r}: {job['status']}{reason}"


def jobs_table(jobs: list[dict]) -> Table:
    from rich.table import Table

    table = Table("id", "name", "status", "step", "S", "R", "task", "created", box=None, header_style="bold")
    for job in jobs:
        table.add_row(str(job["id"]), job["name"], job["status"], f"{job['learner_step']}/{job['max_steps']}",
                      str(job["staleness"]), str(job["batch_trajectories"]), str(job["task"].get("name", "")),
                      job["created_at"][:19].replace("T", " "))
    return table


def summary_rows(summary: dict, *, staleness: int | None = None) -> list[tuple[str, str]]:
    """The headline figures of a job (the job page's summary), as (label, value)."""
    s = summary
    target = fmt(s.get("throughput_target"), 1)
    final = bool(s.get("final"))  # a finished job: its final figures, no projection (the job page's words)
    as_of = s.get("as_of_step")
    reward = (("mean reward", fmt(s.get("reward_mean"))) if as_of is None else (  # before any step, or an older site
        f"{'final ' if final else ''}mean reward ({s.get('reward_recent_steps')}-step)",
        f"{fmt(s.get('reward_recent_mean'))} as of step {as_of} (that step alone {fmt(s.get('reward_mean'))})"))
    return [
        ("status", s["status"] + (f" ({s['status_reason']})" if s.get("status_reason") else "")),
        *([("waiting", s["waiting_reason"])] if s.get("waiting_reason") else []),  # why it has no workers now
        # the owner's reward functions failing (on the workers or the learner): loud, not only on the web page
        *([("reward function errors", s["reward_errors_line"])] if s.get("reward_errors_line", "0") != "0" else []),
        *([("learner storage", s["learner_storage_line"])] if s.get("learner_storage_line", "ok") != "ok" else []),
        ("step", f"{s['step']} / {s['max_steps']}"),
        reward,
        *((f"  {f['function']}", function_line(f)) for f in s.get("reward_functions") or []),  # the job page's table
        ("max staleness" + (f" (S={staleness})" if staleness else ""), fmt(s.get("max_staleness"))),
        ("dropped stale", fmt(s.get("dropped_stale"))),
        ("bubble (learner wait)", fmt(s.get("bubble_ratio"))),
        ("T_train / T_bcast", f"{fmt(s.get('t_train'), 3, ' s')} / {fmt(s.get('t_bcast'), 3, ' s')}"),
        ("snapshot", f"v{s['published_version']}"),
        ("active workers", str(s["active_workers"])),
        ("throughput / target", f"{fmt(s.get('pool_throughput'), 1)} / {target} traj/s"),
        *([("target", s["throughput_target_line"])] if s.get("throughput_target_line") else []),
        *([("held-out pass@1", eval_line(s["eval"]))] if s.get("eval") else []),
        ("spent (ledger, final)" if final else "cost so far", fmt(s.get("cost_usd"), 4, " USD")),
        *([] if final else [("projected cost", fmt(s.get("projected_cost_usd"), 4, " USD"))]),
    ]


def function_line(row: dict) -> str:
    """One reward function the learner scores (the summary's ``reward_functions``): its mean, the records it failed
    on, and its last error's first line."""
    errors = ("no record yet" if row.get("error_rate") is None else
              f"errors {100 * row['error_rate']:.1f}% ({row.get('errors')} of {row.get('records')})")
    last = f"; last: {row['last_error']}" if row.get("last_error") else ""
    return f"mean {fmt(row.get('mean'))}, {errors}{last}"


def eval_line(summary_eval: dict) -> str:
    """The job's held-out evaluations (the summary's ``eval``): the first (the base) and the latest, pass@1 greedy
    and mean@k."""
    def one(e: dict) -> str:
        sampled = f" (mean@{e.get('k')} {fmt(e.get('mean_at_k'))})" if e.get("mean_at_k") is not None else ""
        return f"{fmt(e.get('pass_at_1'))} at v{e.get('version')}{sampled}"

    first, last = summary_eval["first"], summary_eval["last"]
    where = f" on {last.get('problems')} problems" + (f" ({last['split']})" if last.get("split") else "")
    return (one(first) if first == last else f"{one(first)} -> {one(last)}") + where


def summary_table(summary: dict, *, title: str = "", staleness: int | None = None) -> Table:
    from rich.table import Table

    table = Table(box=None, show_header=False, title=title or None, title_justify="left", title_style="bold")
    table.add_column(style="dim")
    table.add_column()
    for label, value in summary_rows(summary, staleness=staleness):
        table.add_row(label, value)
    return table


def workers_table(workers: list[dict]) -> Table:
    from rich.table import Table

    table = Table("worker", "gpu", "$/h", "mu (traj/s)", "state", "version", "behind", "billed USD", box=None,
                  header_style="bold")
    for w in workers:
        version = "base" if w.get("installed_version") is None else str(w["installed_version"])
        table.add_row(w["name"], w.get("gpu", ""), fmt(w.get("price_per_hour"), 2), fmt(w.get("throughput"), 1),
                      w.get("state") or "-", version, str(w.get("behind", 0)), fmt(w.get("cost_usd"), 4))
    return table


def watch_view(job: dict, live: dict) -> Group:
    """The live view of ``echo2 job watch``: the headline figures, then the active workers."""
    from rich.console import Group
    from rich.text import Text

    title = f"job {job['id']} {job['name']!r}"
    parts = [summary_table(live["summary"], title=title, staleness=job.get("staleness"))]
    if live.get("workers"):
        parts += [Text(""), workers_table(live["workers"])]
    parts.append(Text("Ctrl-C leaves the view; the job goes on.", style="dim"))
    return Group(*parts)


def metric_line(m: dict) -> str:
    """One learner step (``GET /api/jobs/{id}/metrics/``) as a log line."""
    return (f"step {m['step']:>6}  reward {fmt(m.get('reward_mean'), 4)} ± {fmt(m.get('reward_std'), 4)}  "
            f"loss {fmt(m.get('loss'), 4)}  lag {fmt(m.get('max_staleness'))}  dropped {fmt(m.get('dropped_stale'))}  "
            f"train {fmt(m.get('t_train'), 3, 's')}  wait {fmt(m.get('wait_s'), 3, 's')}")


def export_line(written: dict) -> str:
    """What ``echo2 job export`` prints: the version, the dtype, where, and what."""
    size = sum(written["files"].values())
    return (f"job {written['job']} v{written['version']} ({written['dtype']}) exported to {written['out']}: "
            f"{', '.join(sorted(written['files']))} ({size / 1e6:.1f} MB)")


def learner_hint(job: dict, server: str, token_file: str | None = None) -> str:
    """What the owner runs next: the job trains only while its learner runs (on the learner's machine). The command
    is whole (the site hands the learner its door to the job's streams); ``token_file`` is the one this command
    used, else the learner reads ``~/.echo2-token``."""
    verb = "is waiting for" if job.get("status") == "running" else "will need (after `echo2 job start`)"
    where = "" if token_file else f" (your API token in {TOKEN_FILE}, mode 600)"
    command = learner_command(server=server, job_id=job["id"], **({"token_file": token_file} if token_file else {}))
    return (f"job {job['id']} {verb} its learner: on the learner machine run{where}\n"
            f"  {command}\n"
            f"then follow it: echo2 job watch {job['id']}")

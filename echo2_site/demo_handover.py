"""What ``make demo`` hands over when its job ends: where the dashboard is and who signs in, the owner's token file,
and the next commands, each runnable as printed from the checkout (paths relative to it)."""

from __future__ import annotations

import shlex
from collections.abc import Callable
from pathlib import Path

from dataplane.learner_command import learner_command


def shown(path: Path) -> str:
    """``path`` relative to the current directory when it lies below it (what a user pastes), else absolute."""
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def learner_argv(*, server: str, job_id: int, workdir: Path, bin_dir: Path,
                 show: Callable[[Path], str] = str) -> list[str]:
    """The demo's learner: the whole command an owner runs (the site hands the learner its door to the job's
    streams: no Redis URL), its files in the demo's folder. ``show`` writes the paths (``shown`` when printed)."""
    command = learner_command(server=server, job_id=job_id, token_file=show(workdir / "tokens" / "demo"),
                              program=show(bin_dir / "echo2-learner"))
    return [*shlex.split(command), "--snapshot-dir", show(workdir / "snapshots"), "--logdir", show(workdir / "runs")]


def handover_lines(*, server: str, job_id: int, workdir: Path, bin_dir: Path, providers: list[str],
                   keep_running: bool, make_target: str = "demo") -> list[str]:
    """The closing block: dashboard and logins, token files, the owner CLI's next commands, and how the site stays
    up (or that it stops, and the flag that keeps it)."""
    tokens = workdir / "tokens"
    export_dir = shown(workdir / f"export-job{job_id}")
    learner = shlex.join(learner_argv(server=server, job_id=job_id, workdir=workdir, bin_dir=bin_dir, show=shown))
    bin_dir = shown(bin_dir)
    lines = [
        f"dashboard        {server}/jobs/{job_id}/  (owner login: demo / demo; staff, so /admin/ too)",
        f"providers        {', '.join(f'{name} / {name}' for name in providers)}  (dashboard logins, "
        f"password = name)",
        f"owner's token    {shown(tokens / 'demo')}  (mode 600; the providers' beside it: "
        f"{', '.join(shown(tokens / name) for name in providers)})",
        "the job's learner, as the demo ran it (the site hands it its own door to the job's streams):",
        f"  {learner}",
        "next, from this checkout (the owner's CLI, docs/cli.md):",
        f"  export ECHO2_SERVER={server} ECHO2_TOKEN_FILE={shown(tokens / 'demo')}",
        f"  {bin_dir}/echo2 job status {job_id}",
        f"  {bin_dir}/echo2 job samples {job_id}",
        f"  {bin_dir}/echo2-learner export --job {job_id} --snapshot-dir {shown(workdir / 'snapshots')} "
        f"--out {export_dir}",
    ]
    if keep_running:
        lines.append(f"the site stays up at {server} until Ctrl-C, which stops every demo process")
    else:
        lines.append("the site stops with the demo now; to keep it up until Ctrl-C: "
                     f"make {make_target} DEMO_ARGS=--keep-running")
    return lines

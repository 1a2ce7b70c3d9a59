"""``echo2``: launch ECHO-2 jobs from job files and follow them.

\b
Examples:
  echo2 login --server https://echo2.example --token-file ~/echo2-token   # once; saved (mode 600)
  echo2 job submit job.toml --set loss.kl_beta=0.05 --set staleness=4
  echo2 job submit job.toml --dry-run        # check the file, print the resolved settings, send nothing
  echo2 job list
  echo2 job watch 7                          # live: step, reward, staleness, bubble, workers, cost
  echo2 job logs 7 --follow
  echo2 job pause 7; echo2 job resume 7; echo2 job cancel 7
  echo2 job spec 7 --format toml --out job-7.toml
  echo2 job export 7 --out models/job7               # the newest snapshot as a Hugging Face directory
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from . import login, money, render, samples
from .client import BAD_INPUT, CliError, Site
from .options import DEFAULT_SERVER, JsonOpt, ServerOpt, TokenFileOpt, one_line_errors
from .options import console as _console
from .options import print_json as _print
from .options import site as _site

if TYPE_CHECKING:  # the job-spec modules load where a command needs them: `echo2 --help` stays under 0.5 s
    from dataplane.jobs import JobSpec

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)
job_app = typer.Typer(no_args_is_help=True, help="Submit, follow and control your jobs.", rich_markup_mode=None)
app.add_typer(job_app, name="job")

IntervalOpt = Annotated[float, typer.Option(min=0.1, help="Seconds between refreshes.")]


@job_app.command()
@one_line_errors
def submit(
    file: Annotated[Path, typer.Argument(help="Job file: .toml, .yaml or .yml (docs/cli.md).")],
    set_: Annotated[list[str] | None, typer.Option("--set", metavar="KEY=VALUE", help=(
        "Override a setting (repeatable); dotted keys reach into tables: --set loss.kl_beta=0.05. VALUE is a TOML "
        "or JSON value (0.05, true, \"text\", null), else text."))] = None,
    start: Annotated[bool, typer.Option("--start/--no-start", help="Start the job at once, or leave a draft.")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Check the job and print its resolved settings "
                                          "(TOML; JSON with --json); send nothing.")] = False,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """Create a job from a job file (checked here first: every error at once, unknown keys named)."""
    from dataplane.dataset.content import pack
    from dataplane.dataset.jobfile import upload_path
    from dataplane.jobfiles import apply_overrides, dump_toml, load_job_file
    from dataplane.jobs import parse_job_spec
    from dataplane.usercode import upload_path as code_upload_path

    raw = apply_overrides(load_job_file(file), set_ or [])
    upload = upload_path(raw)  # a data set named by path in the file: the site takes its content, never a path
    code = code_upload_path(raw)  # the modules it ships to the workers (task.code_modules), packed by content
    spec = parse_job_spec(raw)  # the site checks again; this answers at once, before any network
    _say_when_workers_need_installed_code(spec)
    if dry_run:
        resolved = spec.model_dump(mode="json")
        typer.echo(json.dumps(resolved) if json_output else dump_toml(resolved), nl=json_output)
        problem = _reward_preflight(spec)
        if problem:
            raise CliError(problem, BAD_INPUT)
        return
    with _site(server, token_file) as site:
        for path in (p for p in (upload, code) if p is not None):  # the code package is stored as a data set is
            site.request("POST", "datasets/", content=pack(path), headers={"Content-Type": "application/x-tar"})
        job = site.post("jobs/", json.loads(json.dumps(raw, default=str)))
        _say_when_no_worker_qualifies(site, raw)
        if start:
            try:
                job = site.post(f"jobs/{job['id']}/start/")
            except CliError as err:
                raise CliError(f"job {job['id']} was created as a draft but not started: {err}", err.code) from None
    if json_output:
        _print(job)
        return
    typer.echo(render.job_line(job))
    typer.echo(render.learner_hint(job, site.server, str(token_file.expanduser().resolve()) if token_file else None))


def _say_when_workers_need_installed_code(spec: JobSpec) -> None:
    """One line on stderr when the job runs the owner's code on the workers and ships no code package for it: each
    worker would need the modules installed by hand, which a marketplace's providers do not do."""
    from dataplane.tasks import build_task

    task = build_task(spec.task)
    if task.user_code() and not task.code:
        modules = sorted({ref.partition(":")[0] for ref in task.user_code()})
        typer.echo(f"echo2: the workers run this job's own code ({', '.join(task.user_code())}) and the job ships "
                   f"none: a worker imports it only where it is installed; add task.code_modules = "
                   f"{json.dumps(modules)} to ship it (docs/rewards.md, \"Code on the workers\")", err=True)


def _say_when_no_worker_qualifies(site: Site, raw: dict) -> None:
    """One line on stderr when no online worker meets the job's requirements now (the launch preview's count: the
    reasons, e.g. ``user code 3`` for a job shipping its own code to workers that did not opt in). The job is
    created either way: workers may come; a preview the site cannot answer says nothing."""
    try:
        plan = site.post("jobs/plan/", json.loads(json.dumps(raw, default=str)))
    except CliError:
        return
    matching = plan.get("requirements") if isinstance(plan, dict) else None
    if isinstance(matching, dict) and matching.get("total") and not matching.get("qualify"):
        hint = (" (workers run a job's own code only with echo2-agent run --allow-user-code)"
                if matching.get("excluded", {}).get("user code") else "")
        typer.echo(f"echo2: no online worker qualifies for this job now: {matching.get('line')}{hint}", err=True)


def _reward_preflight(spec: JobSpec) -> str:
    """The owner's reward functions (those the learner scores) called on a few rows of the job file's data set, as
    the learner does before step 1, importing them from here as the learner does from where it runs: "" when
    they return numbers (or there are none, or this machine holds no rows), else the failure with its traceback."""
    from dataplane.dataset.content import locate
    from dataplane.rewards import TrainerState
    from dataplane.tasks import build_task

    task = build_task(spec.task)
    if not task.learner_scored() or not all(locate(d) is not None for d in task.content_digests()):
        return ""
    sys.path.insert(0, os.getcwd())
    try:
        return task.owner_preflight(4, chat=spec.prompt_format,
                                    trainer_state=TrainerState(global_step=0, max_steps=spec.max_steps))
    finally:
        sys.path.remove(os.getcwd())


@job_app.command("list")
@one_line_errors
def list_jobs(archived: Annotated[bool, typer.Option("--archived", help="Include archived jobs.")] = False,
              server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
              json_output: JsonOpt = False) -> None:
    """Your jobs, newest first (archived ones only with --archived)."""
    with _site(server, token_file) as site:
        jobs = site.jobs(archived=archived)
    _print(jobs) if json_output else _console().print(render.jobs_table(jobs) if jobs else "no jobs yet")


@job_app.command()
@one_line_errors
def status(job_id: int, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
           json_output: JsonOpt = False) -> None:
    """A job's headline figures: step, reward, staleness, bubble, workers, cost."""
    with _site(server, token_file) as site:
        job = site.get(f"jobs/{job_id}/")
        summary = site.get(f"jobs/{job_id}/summary/")
    if json_output:
        _print({"job": job, "summary": summary})
    else:
        _console().print(render.summary_table(summary, title=f"job {job_id} {job['name']!r}",
                                              staleness=job["staleness"]))


@job_app.command()
@one_line_errors
def watch(job_id: int, interval: IntervalOpt = 1.0, server: ServerOpt = DEFAULT_SERVER,
          token_file: TokenFileOpt = None, json_output: JsonOpt = False) -> None:
    """A live view of the job, refreshed every INTERVAL seconds until it ends; Ctrl-C leaves it (the job goes on).
    With --json, one summary object per refresh."""
    from rich.live import Live

    with _site(server, token_file) as site:
        job = site.get(f"jobs/{job_id}/")
        try:
            with Live(console=_console(), auto_refresh=False) if not json_output else _nothing() as view:
                _watch_loop(site, job, interval, lambda live: _print(live["summary"]) if json_output
                            else view.update(render.watch_view(job, live), refresh=True))
        except KeyboardInterrupt:
            typer.echo(f"stopped watching job {job_id}; it goes on", err=True)


@contextmanager
def _nothing() -> Iterator[None]:
    yield None


def _watch_loop(site: Site, job: dict, interval: float, show: Callable[[dict], None]) -> None:
    """Fetch the job's live figures and show them until the job reaches a final status."""
    since = job["learner_step"]  # the view shows figures, not the history of steps
    while True:
        live = site.get(f"jobs/{job['id']}/live/", since=since)
        since = live["summary"]["step"]
        show(live)
        if live["summary"]["status"] in render.TERMINAL:
            return
        time.sleep(interval)


@job_app.command()
@one_line_errors
def logs(job_id: int, follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep printing new steps until "
                                                            "the job ends.")] = False,
         interval: IntervalOpt = 1.0, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
         json_output: JsonOpt = False) -> None:
    """The learner's step reports: reward, loss, largest lag, dropped stale records, T_train, wait."""
    since = 0
    with _site(server, token_file) as site:
        try:
            while True:
                ended = not follow or site.get(f"jobs/{job_id}/")["status"] in render.TERMINAL
                for metric in site.get(f"jobs/{job_id}/metrics/", since=since):
                    _print(metric) if json_output else typer.echo(render.metric_line(metric))
                    since = metric["step"]
                if ended:
                    return
                time.sleep(interval)
        except KeyboardInterrupt:
            return


def _control(verb: str, help_text: str) -> None:
    """``echo2 job pause|resume|cancel ID``: one POST each."""

    @one_line_errors
    def command(job_id: int, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
                json_output: JsonOpt = False) -> None:
        with _site(server, token_file) as site:
            job = site.post(f"jobs/{job_id}/{verb}/")
        _print(job) if json_output else typer.echo(render.job_line(job))

    command.__doc__ = help_text
    job_app.command(verb)(command)


_control("start", "Start a draft job.")
_control("pause", "Release the job's workers (generation and billing stop); queued trajectories are still trained.")
_control("resume", "Run a paused job again (or a failed one, from its learner's last checkpoint).")
_control("cancel", "End the job and release its workers.")


@job_app.command()
@one_line_errors
def spec(job_id: int,
         format_: Annotated[str, typer.Option("--format", help="toml, yaml or json.")] = "toml",
         out: Annotated[Path | None, typer.Option(help="Write to this file (default: standard output).")] = None,
         server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None) -> None:
    """The job's resolved settings (every default filled in) as a job file that `submit` takes back."""
    if format_ not in ("toml", "yaml", "json"):
        raise CliError(f"--format: {format_!r} is not one of toml, yaml, json", BAD_INPUT)
    with _site(server, token_file) as site:
        text = site.request("GET", f"jobs/{job_id}/spec/", params={"format": format_},
                            headers={"Accept": "*/*"}).text
    if out is None:
        typer.echo(text, nl=not text.endswith("\n"))
    else:
        out.write_text(text)


@job_app.command()
@one_line_errors
def export(
    job_id: int,
    out: Annotated[Path, typer.Option("--out", help="Directory to write (created; must be empty).")],
    version: Annotated[int | None, typer.Option(min=0, help="Snapshot version (default: the newest published; "
                                                "0: the base model).")] = None,
    bf16: Annotated[bool, typer.Option("--bf16", help="Floating weights cast to bfloat16 (default: as trained).")]
    = False,
    server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None, json_output: JsonOpt = False,
) -> None:
    """Download a snapshot of your job as a Hugging Face directory (config, tokenizer, model.safetensors) that
    AutoModelForCausalLM.from_pretrained and vLLM load as is. The site fetches it from the job's learner while
    that runs; after the job, use `echo2-learner export` on the learner's machine (docs/learner.md)."""
    from dataplane.export import ExportError, unpack

    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise CliError(f"--out: {out} exists and is not an empty directory", BAD_INPUT)
    params = {"dtype": "bf16" if bf16 else "as-trained", **({"version": version} if version is not None else {})}
    created = not out.exists()
    try:
        with _site(server, token_file) as site, site.download(f"jobs/{job_id}/export/", params) as (response, body):
            total = int(response.headers.get("Content-Length", 0)) or None
            with _progress(f"job {job_id} v{response.headers.get('X-Echo2-Version', '?')}", total,
                           quiet=json_output) as advance:
                names = unpack(_Counted(body, advance), out)
    except (CliError, ExportError) as err:  # a download broken off leaves no half directory behind
        if created:
            shutil.rmtree(out, ignore_errors=True)
        raise CliError(str(err), getattr(err, "code", 1)) from None
    written = {"job": job_id, "version": int(response.headers.get("X-Echo2-Version", -1)),
               "dtype": response.headers.get("X-Echo2-Dtype", params["dtype"]), "out": str(out.resolve()),
               "files": {name: (out / name).stat().st_size for name in names}}
    if json_output:
        _print(written)
    else:
        typer.echo(render.export_line(written))


@contextmanager
def _progress(label: str, total: int | None, *, quiet: bool) -> Iterator[Callable[[int], None]]:
    """A download bar on stderr (none with --json, or where stderr is no terminal: rich leaves it out)."""
    if quiet:
        yield lambda n: None
        return
    from rich.console import Console
    from rich.progress import DownloadColumn, Progress, TransferSpeedColumn

    with Progress(*Progress.get_default_columns(), DownloadColumn(), TransferSpeedColumn(),
                  console=Console(stderr=True), transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


class _Counted:
    """A binary stream that reports how much was read."""

    def __init__(self, stream: Any, advance: Callable[[int], None]) -> None:
        self._stream, self._advance = stream, advance

    def read(self, n: int = -1) -> bytes:
        data = self._stream.read(n)
        self._advance(len(data))
        return data


login.register(app)  # echo2 login, echo2 logout
money.register(app, job_app)  # echo2 ledger, echo2 worker ..., echo2 job budget|archive|unarchive|delete
samples.register(job_app)  # echo2 job samples


def main() -> None:
    app()

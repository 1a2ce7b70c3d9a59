"""``echo2 ledger``, ``echo2 worker ...`` and the owner's ``echo2 job budget|archive|unarchive|delete``: money and
controls (docs/ledger.md, docs/cli.md). Added to the ``echo2`` app by ``echo2_cli.cli`` (:func:`register`).

\b
Examples:
  echo2 ledger                                # per job, per worker and per day, totals to the cent
  echo2 ledger --job 7 --entries              # the job's invoice: every billed interval
  echo2 ledger --worker 3 --from 2026-12-01 --to 2027-01-01   # a payout statement for December
  echo2 ledger --worker 3 --from 2026-12-01 --csv --out december.csv   # a worker's statement as CSV
  echo2 worker list; echo2 worker price 3 0.42; echo2 worker pause 3; echo2 worker resume 3; echo2 worker remove 3
  echo2 job budget 7 25; echo2 job archive 7; echo2 job delete 8
"""

from __future__ import annotations

import json
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Annotated

import typer

from . import render  # job_line
from .client import BAD_INPUT, CliError
from .options import DEFAULT_SERVER, JsonOpt, ServerOpt, TokenFileOpt, one_line_errors
from .options import console as _console
from .options import print_json as _print
from .options import site as _site

worker_app = typer.Typer(no_args_is_help=True, help="Your machines: price, pause, resume, remove.",
                         rich_markup_mode=None)
job_commands = typer.Typer()  # the job's commands here, added to ``echo2 job`` by :func:`register`


def register(app: typer.Typer, job_app: typer.Typer) -> None:
    """Add ``echo2 ledger``, ``echo2 worker ...`` and ``echo2 job budget|archive|unarchive|delete`` to the CLI."""
    app.command("ledger")(ledger)
    app.add_typer(worker_app, name="worker")
    job_app.registered_commands += job_commands.registered_commands


def _ledger_table(entries: list[dict]):
    from rich.table import Table

    table = Table("billed at", "job", "worker", "state", "seconds", "USD/h", "USD", box=None, header_style="bold")
    for e in entries:
        table.add_row(e["at"][:19].replace("T", " "), f"{e['job_id']} {e['job_name']}",
                      f"{e['worker_id']} {e['worker_name']}", e["state"], e["seconds"], e["rate_per_hour"],
                      e["amount_usd"])
    return table


def _summary_tables(totals: dict) -> list:
    """The totals per job, per worker and per UTC day (a statement or an invoice at a glance), each to the cent."""
    from rich.table import Table

    tables = []
    for key, title, head in (("by_job", "per job", "job"), ("by_worker", "per worker", "worker"),
                             ("by_day", "per day (UTC)", "day")):
        table = Table(head, "hours", "USD", title=title, title_justify="left", box=None, header_style="bold")
        for r in totals.get(key, []):
            label = r["day"] if key == "by_day" else f"{r['id'] if r['id'] is not None else '-'} {r['name']}"
            table.add_row(label, f"{Decimal(r['seconds']) / 3600:.3f}", r["total_usd"])
        tables.append(table)
    return tables


def _totals_line(totals: dict) -> str:
    rates = ", ".join(f"{r['seconds']} s at {r['rate_per_hour']}/h" for r in totals["by_rate"])
    return f"{totals['entries']} entries, total {totals['total_usd']} USD" + (f" ({rates})" if rates else "")


def _worker_line(w: dict) -> str:
    """One worker in a sentence: what ``echo2 worker ...`` prints."""
    flags = [f for f, on in (("paused", w.get("paused_at")), ("removed", w.get("removed_at"))) if on]
    return (f"worker {w['id']} {w['name']!r}: {w['status']}, {w['price_per_hour']} USD/h"
            + (f" ({', '.join(flags)})" if flags else ""))


def _decimal(value: str, field: str) -> str:
    try:
        number = Decimal(value)
    except InvalidOperation:
        raise CliError(f"{field}: must be a number, not {value!r}", BAD_INPUT) from None
    if not number.is_finite() or number <= 0:
        raise CliError(f"{field}: must be a positive number of USD", BAD_INPUT)
    return str(number)


@one_line_errors
def ledger(
    job: Annotated[int | None, typer.Option(help="Only this job's entries.")] = None,
    worker: Annotated[int | None, typer.Option(help="Only this worker's entries.")] = None,
    since: Annotated[str | None, typer.Option("--from", help="Billed at or after (ISO 8601 date or time).")] = None,
    until: Annotated[str | None, typer.Option("--to", help="Billed before (ISO 8601 date or time).")] = None,
    entries: Annotated[bool, typer.Option("--entries", help="Every billed interval, not only the summaries.")] = False,
    as_csv: Annotated[bool, typer.Option("--csv", help="CSV, one line per entry, the total last (its own column).")
                      ] = False,
    out: Annotated[Path | None, typer.Option(help="Write to this file instead of the terminal.")] = None,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """What you were billed or earned (your jobs': an invoice; your workers': a statement; --from/--to: a period):
    totals per job, per worker and per day, to the cent; every billed interval with --entries (or --json, --csv)."""
    params = {k: v for k, v in {"job": job, "worker": worker, "from": since, "to": until}.items() if v is not None}
    with _site(server, token_file) as site:
        if as_csv:
            text = site.request("GET", "ledger/", params=params | {"format": "csv"},
                                headers={"Accept": "text/csv"}).text
        elif entries or json_output:
            data = site.ledger(**params)
            text = json.dumps(data) if json_output else None
        else:  # every page carries the totals of everything selected: one short page is enough for the summaries
            data = site.get("ledger/", limit=1, **params)
            text = None
    if text is None:
        shown = [_ledger_table(data["entries"])] if entries else _summary_tables(data["totals"])
        _console().print(*shown, _totals_line(data["totals"]))
    elif out is not None:
        out.write_text(text)
        typer.echo(f"wrote {out}")
    else:
        typer.echo(text, nl=not as_csv)


@worker_app.command("list")
@one_line_errors
def list_workers(removed: Annotated[bool, typer.Option("--removed", help="Include removed workers.")] = False,
                 server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
                 json_output: JsonOpt = False) -> None:
    """Your workers: price, status, paused or removed."""
    with _site(server, token_file) as site:
        workers = site.get("workers/", limit=1000, **({"removed": 1} if removed else {}))["results"]
    if json_output:
        _print(workers)
    else:
        for w in workers:
            typer.echo(_worker_line(w))


@worker_app.command()
@one_line_errors
def price(worker_id: int, usd_per_hour: Annotated[str, typer.Argument(help="The new price, USD per hour.")],
          server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None, json_output: JsonOpt = False) -> None:
    """Change a worker's price from now on (its open activation's later intervals are billed at it)."""
    body = {"price_per_hour": _decimal(usd_per_hour, "price_per_hour")}
    with _site(server, token_file) as site:
        worker = site.post(f"workers/{worker_id}/price/", body)
    _print(worker) if json_output else typer.echo(_worker_line(worker))


def _worker_control(verb: str, method: str, path: str, help_text: str) -> None:
    @one_line_errors
    def command(worker_id: int, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
                json_output: JsonOpt = False) -> None:
        with _site(server, token_file) as site:
            worker = site.request(method, f"workers/{worker_id}/{path}").json()
        _print(worker) if json_output else typer.echo(_worker_line(worker))

    command.__doc__ = help_text
    worker_app.command(verb)(command)


_worker_control("pause", "POST", "pause/", "No new activations; its open one is released now (leases returned).")
_worker_control("resume", "POST", "resume/", "Activations again, from the scheduler's next re-plan.")
_worker_control("remove", "DELETE", "", "Unregister it: its agent key revoked, its history and ledger kept.")


@job_commands.command()
@one_line_errors
def budget(job_id: int, usd: Annotated[str, typer.Argument(help="The new budget in USD, or 'none' for no cap.")],
           server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None, json_output: JsonOpt = False) -> None:
    """Change a job's budget; a job paused at its budget runs again when the new one leaves room for a step."""
    value = None if usd.lower() == "none" else float(_decimal(usd, "budget_usd"))
    with _site(server, token_file) as site:
        job = site.post(f"jobs/{job_id}/budget/", {"budget_usd": value})
    _print(job) if json_output else typer.echo(render.job_line(job) + f"  budget {job.get('budget_usd')}")


def _job_control(verb: str, method: str, path: str, help_text: str) -> None:
    @one_line_errors
    def command(job_id: int, server: ServerOpt = DEFAULT_SERVER, token_file: TokenFileOpt = None,
                json_output: JsonOpt = False) -> None:
        with _site(server, token_file) as site:
            response = site.request(method, f"jobs/{job_id}/{path}")
        if method == "DELETE":
            _print({"id": job_id, "deleted": True}) if json_output else typer.echo(f"job {job_id} deleted")
            return
        _print(response.json()) if json_output else typer.echo(render.job_line(response.json()))

    command.__doc__ = help_text
    job_commands.command(verb)(command)


_job_control("archive", "POST", "archive/", "Hide an ended job from lists (its ledger and history stay).")
_job_control("unarchive", "POST", "unarchive/", "List an archived job again.")
_job_control("delete", "DELETE", "", "Delete a job that never ran (one that did: archive it).")

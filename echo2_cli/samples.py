"""``echo2 job samples ID``: a few records the learner trained, newest step first, with their rewards
(``GET /api/jobs/<id>/samples/``, docs/cli.md). Added to ``echo2 job`` by ``echo2_cli.cli`` (:func:`register`).

\b
Examples:
  echo2 job samples 7                          # the newest 20
  echo2 job samples 7 --min-reward 1 -n 5      # five that earned the full reward
  echo2 job samples 7 --max-reward 0 --json    # the failures, as JSON
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

import typer

from .options import DEFAULT_SERVER, JsonOpt, ServerOpt, TokenFileOpt, one_line_errors
from .options import console as _console
from .options import print_json as _print
from .options import site as _site

if TYPE_CHECKING:  # rich loads when a table is drawn, not for `echo2 --help`
    from rich.table import Table

TEXT_SHOWN = 400  # characters of a prompt or completion in the table (--json has them whole)


def register(job_app: typer.Typer) -> None:
    """Add ``echo2 job samples`` to the CLI."""
    job_app.command("samples", help=__doc__)(samples)


def samples_table(rows: list[dict]) -> Table:
    from rich.table import Table

    table = Table("step", "version", "worker", "reward", "prompt", "completion", show_lines=True)
    for row in rows:
        table.add_row(str(row["step"]), f"v{row['version']}", str(row["worker"] or "–"), f"{row['reward']:.3g}",
                      _cut(row["prompt"]), _cut(row["completion"]))
    return table


def _cut(text: str) -> str:
    return text if len(text) <= TEXT_SHOWN else text[:TEXT_SHOWN - 1] + "…"


@one_line_errors
def samples(
    job_id: Annotated[int, typer.Argument(metavar="ID", help="The job.")],
    min_reward: Annotated[float | None, typer.Option(help="Only samples whose reward is at least this.")] = None,
    max_reward: Annotated[float | None, typer.Option(help="Only samples whose reward is at most this.")] = None,
    limit: Annotated[int, typer.Option("--limit", "-n", min=1, max=200, help="How many (the newest).")] = 20,
    server: ServerOpt = DEFAULT_SERVER,
    token_file: TokenFileOpt = None,
    json_output: JsonOpt = False,
) -> None:
    """A few records the learner trained (prompt, completion, reward, version, worker), newest step first."""
    params = {k: v for k, v in {"min_reward": min_reward, "max_reward": max_reward, "limit": limit}.items()
              if v is not None}
    with _site(server, token_file) as site:
        rows = site.get(f"jobs/{job_id}/samples/", **params)
    if json_output:
        _print(rows)
    elif not rows:
        typer.echo(f"job {job_id}: no samples yet (the learner reports a few every --samples-every steps)")
    else:
        _console().print(samples_table(rows))

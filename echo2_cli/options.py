"""What every ``echo2`` command shares: the site and token options, ``--json``, one-line errors, the site client."""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from . import config
from .client import BAD_INPUT, CliError, Site, owner_token

ServerOpt = Annotated[str | None, typer.Option("--server", envvar="ECHO2_SERVER", show_default=False, help=(
    "Site URL [default: the one `echo2 login` saved, else http://127.0.0.1:8000]."))]
TokenFileOpt = Annotated[Path | None, typer.Option(
    "--token-file", envvar="ECHO2_TOKEN_FILE", help="A file holding your API token (first line; keep it mode 600). "
    "Without it, ECHO2_TOKEN. There is no --token: a token on the command line shows in `ps`.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the API's JSON (one object per line), for machines.")]
DEFAULT_SERVER = None  # every command's --server default: resolved by server_url()
LOCAL_SITE = "http://127.0.0.1:8000"


def one_line_errors(command: Callable) -> Callable:
    """Print a failure as one line on stderr and exit non-zero (2: bad input, 1: the rest); the traceback
    only with ECHO2_DEBUG=1."""

    @functools.wraps(command)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return command(*args, **kwargs)
        except Exception as err:
            # imported here, on the way out of a failure: `echo2 --help` loads no job-spec module (< 0.5 s)
            from dataplane.jobfiles import JobFileError
            from dataplane.jobs import JobSpecError

            if not isinstance(err, CliError | JobSpecError | JobFileError) or os.environ.get("ECHO2_DEBUG"):
                raise
            message = err.one_line() if isinstance(err, JobSpecError) else str(err)
            typer.echo(f"echo2: error: {message}", err=True)
            raise typer.Exit(err.code if isinstance(err, CliError) else BAD_INPUT) from None

    return wrapper


def server_url(server: str | None) -> str:
    """``--server`` (ECHO2_SERVER), else the site ``echo2 login`` saved, else a site on this machine."""
    return (server or config.load().get("server") or LOCAL_SITE).rstrip("/")


@contextmanager
def site(server: str | None, token_file: Path | None) -> Iterator[Site]:
    url = server_url(server)
    site = Site(url, owner_token(token_file, url))
    try:
        yield site
    finally:
        site.close()


def print_json(data: Any) -> None:
    typer.echo(json.dumps(data))


def console():
    from rich.console import Console

    return Console()

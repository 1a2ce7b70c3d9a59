"""``echo2 login`` and ``echo2 logout``: the site and the owner's API token kept in a config file (echo2_cli/config.py)
so that later commands need neither ``--server`` nor ``--token-file``."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer

from dataplane.tokens import read_token_file

from . import config
from .client import BAD_INPUT, CliError, Site
from .options import DEFAULT_SERVER, ServerOpt, one_line_errors, server_url

LoginTokenFileOpt = Annotated[Path | None, typer.Option(
    "--token-file", help="Read the token from this file (first line). Without it: from stdin when piped, else "
    "asked for (not echoed).")]


def _token(token_file: Path | None) -> str:
    if token_file is not None:
        try:
            return read_token_file(token_file)
        except ValueError as err:
            raise CliError(str(err), BAD_INPUT) from None
    if sys.stdin.isatty():
        token = typer.prompt("API token (from the dashboard's Account page)", hide_input=True)
    else:
        token = sys.stdin.readline()
    token = token.strip()
    if not token:
        raise CliError("login: no token given (on stdin, at the prompt, or with --token-file PATH)", BAD_INPUT)
    return token


@one_line_errors
def login(server: ServerOpt = DEFAULT_SERVER, token_file: LoginTokenFileOpt = None) -> None:
    """Check an API token against the site and save both (mode 600) for every later command.

    \b
    Examples:
      echo2 login --server https://echo2.example --token-file ~/echo2-token
      cat ~/echo2-token | echo2 login --server https://echo2.example
    """
    url = server_url(server)
    token = _token(token_file)
    site = Site(url, token)
    try:
        site.get("jobs/", limit=1)  # any owner endpoint: a wrong token or site is refused here, not later
    except CliError as err:
        raise CliError(f"login to {url} failed, nothing saved: {err}", err.code) from None
    finally:
        site.close()
    path = config.save(server=url, token=token)
    typer.echo(f"logged in to {url}; saved to {path} (mode 600). Next: echo2 job list")


@one_line_errors
def logout() -> None:
    """Delete the saved site and token."""
    path = config.forget()
    typer.echo(f"logged out: deleted {path}" if path else f"not logged in (no {config.config_path()})")


def register(app: typer.Typer) -> None:
    app.command()(login)
    app.command()(logout)

"""The site's REST API as the owner CLI uses it: one httpx client with the owner's token, and every failure
turned into one line (:class:`CliError`) that says what to do, never a traceback."""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:  # httpx is imported where a request is made: `echo2 --help` needs none of it
    import httpx

from dataplane.tokens import read_token_file

from . import config

BAD_INPUT = 2  # exit status for input the site (or the local check) refused: fix the job file, not the network


class CliError(Exception):
    """A failure to print as one line; ``code`` is the exit status (2: bad input, 1: anything else)."""

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code


def owner_token(token_file: Path | None, server: str | None = None) -> str:
    """The owner's API token: from ``--token-file`` (ECHO2_TOKEN_FILE), else ECHO2_TOKEN, else the one
    ``echo2 login`` saved for ``server`` (never sent to another site). There is no ``--token``: a token on the
    command line shows in ``ps`` and in shell history."""
    if token_file is not None:
        try:
            return read_token_file(token_file)
        except ValueError as err:
            raise CliError(str(err)) from None
    token = os.environ.get("ECHO2_TOKEN", "").strip()
    if token:
        return token
    saved = config.load()
    if saved.get("token") and (server is None or saved.get("server") == server):
        return str(saved["token"])
    raise CliError("no API token: run `echo2 login`, give --token-file PATH (or ECHO2_TOKEN_FILE), or set ECHO2_TOKEN")


def reason_of(response: httpx.Response) -> str:
    """Why the site refused a request, on one line: every field error of the API's error shape (``detail``,
    ``errors``), else the detail, else the start of the body."""
    try:
        body = response.json()
    except ValueError:
        text = " ".join(response.text.split())[:200]
        return f"HTTP {response.status_code}" + (f": {text}" if text else "")
    if not isinstance(body, dict):
        return f"HTTP {response.status_code}: {str(body)[:200]}"
    errors = body.get("errors")
    if isinstance(errors, dict) and sum(len(v) if isinstance(v, list) else 1 for v in errors.values()) > 1:
        return "; ".join(f"{field}: {reason}" for field, reasons in errors.items()
                         for reason in (reasons if isinstance(reasons, list) else [reasons]))
    return str(body.get("detail") or f"HTTP {response.status_code}")


def refusal(method: str, path: str, response: httpx.Response) -> CliError:
    """The site's refusal as one line (exit status 2 for a 400)."""
    if response.status_code == 404:
        reason = reason_of(response)  # an object the site names (a snapshot version), else "no such job"
        if reason in ("Not found.", "HTTP 404") or reason.startswith("No Job matches"):
            reason = "not found (no such job, or not yours)"
        return CliError(f"{method} /api/{path}: {reason}")
    return CliError(f"{method} /api/{path}: {reason_of(response)}", BAD_INPUT if response.status_code == 400 else 1)


class _BodyReader(io.RawIOBase):
    """An iterator of byte strings as a readable binary file."""

    def __init__(self, pieces: Iterator[bytes]) -> None:
        self._pieces, self._left = pieces, b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        while not self._left:
            self._left = next(self._pieces, None)
            if self._left is None:
                self._left = b""
                return 0
        n = min(len(buffer), len(self._left))
        buffer[:n], self._left = self._left[:n], self._left[n:]
        return n


LEDGER_PAGE = 1000
"""Entries per ``/api/ledger/`` request: the most the API gives in one page."""


class Site:
    """The owner's view of the REST API (``/api/jobs/...``)."""

    def __init__(self, server: str, token: str, *, timeout: float = 30.0) -> None:
        import httpx

        self.server = server.rstrip("/")
        self._http = httpx.Client(base_url=self.server + "/api/", timeout=timeout,
                                  headers={"Authorization": f"Token {token}", "Accept": "application/json"})

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        import httpx

        try:
            response = self._http.request(method, path, **kwargs)
        except httpx.TransportError as err:
            raise CliError(f"cannot reach the site at {self.server} ({err or type(err).__name__})") from None
        if response.status_code >= 400:
            raise refusal(method, path, response)
        return response

    @contextmanager
    def download(self, path: str, params: dict[str, Any]) -> Iterator[tuple[httpx.Response, BinaryIO]]:
        """GET ``path`` as a stream: the response (headers) and its body as a binary file, read as it arrives."""
        import httpx

        try:
            with self._http.stream("GET", path, params=params, headers={"Accept": "*/*"}) as response:
                if response.status_code >= 400:
                    response.read()
                    raise refusal("GET", path, response)
                yield response, io.BufferedReader(_BodyReader(response.iter_bytes()), buffer_size=1 << 20)
        except httpx.TransportError as err:
            raise CliError(f"cannot reach the site at {self.server}, or it broke off "
                           f"({err or type(err).__name__})") from None

    def get(self, path: str, **params: Any) -> Any:
        return self.request("GET", path, params=params or None).json()

    def post(self, path: str, body: dict | None = None) -> Any:
        return self.request("POST", path, json=body).json()

    def jobs(self, *, archived: bool = False) -> list[dict]:
        """Every job of the owner, newest first (all pages); archived ones too with ``archived``."""
        out, offset = [], 0
        while True:
            page = self.get("jobs/", limit=200, offset=offset, **({"archived": 1} if archived else {}))
            out += page["results"]
            offset += len(page["results"])
            if not page.get("next") or not page["results"]:
                return out

    def ledger(self, **filters: Any) -> dict:
        """Every ledger entry the filters select, all pages followed (``/api/ledger/`` pages by cursor; docs/ledger.md):
        ``{"filters", "totals", "entries"}``, the totals as the last page gave them."""
        page = self.get("ledger/", limit=LEDGER_PAGE, **filters)
        entries = page["entries"]
        while page["next"]:  # its cursor only: the URL's host is as the site saw it (a proxy may differ)
            cursor = parse_qs(urlsplit(page["next"]).query)["cursor"][0]
            page = self.get("ledger/", limit=LEDGER_PAGE, cursor=cursor, **filters)
            entries += page["entries"]
        return {"filters": page["filters"], "totals": page["totals"], "entries": entries}

    def close(self) -> None:
        self._http.close()

"""Reading an API token from a file (a token on a command line shows in ``ps`` and shell history).

Shared by the agent's and the learner's CLIs."""

from __future__ import annotations

from pathlib import Path


def read_token_file(path: Path) -> str:
    """The API token in ``path``: its first line, surrounding whitespace ignored; ValueError with the reason."""
    try:
        lines = Path(path).read_text().strip().splitlines()
    except (OSError, UnicodeDecodeError) as err:
        raise ValueError(f"--token-file: cannot read {path}: {err}") from None
    if not lines or not lines[0].strip():
        raise ValueError(f"--token-file: {path} is empty")
    return lines[0].strip()

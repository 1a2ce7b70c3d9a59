"""The command that trains a job: what the job page, ``echo2 job submit`` and the demo's hand-over print, runnable
as printed. The site hands the learner everything else (its door to the job's streams: docs/trust.md "The learner's
door"), so the whole command is the site, the job and the owner's token file."""

from __future__ import annotations

import shlex

TOKEN_FILE = "~/.echo2-token"
"""Where the page tells an owner to keep their API token (first line; mode 600) when it cannot know the path."""


def learner_command(*, server: str, job_id: int, token_file: str = TOKEN_FILE, program: str = "echo2-learner") -> str:
    """``echo2-learner --server URL --job N --token-file F`` as a shell line (arguments quoted; a leading ``~/`` left
    for the shell to expand)."""
    return " ".join([shlex.quote(program), "--server", shlex.quote(server.rstrip("/")), "--job", str(int(job_id)),
                     "--token-file", _path(token_file)])


def _path(path: str) -> str:
    if path.startswith("~/") and len(path) > 2:
        return "~/" + shlex.quote(path[2:])
    return shlex.quote(path)

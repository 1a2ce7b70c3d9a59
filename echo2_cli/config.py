"""Where ``echo2 login`` keeps the site and the owner's token: one JSON file, mode 0600, in the user's config
folder (``$ECHO2_CONFIG``, else ``$XDG_CONFIG_HOME/echo2/config.json``, else ``~/.config/echo2/config.json``).

Every command reads it last: ``--server``/``ECHO2_SERVER`` and ``--token-file``/``ECHO2_TOKEN_FILE``/``ECHO2_TOKEN``
win over it, and its token is sent only to the site it was saved for."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def config_path() -> Path:
    explicit = os.environ.get("ECHO2_CONFIG")
    if explicit:
        return Path(explicit).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base).expanduser() / "echo2" / "config.json"


def load() -> dict[str, Any]:
    """The saved ``{"server": ..., "token": ...}``; empty when there is none (or it cannot be read as JSON)."""
    try:
        data = json.loads(config_path().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def save(*, server: str, token: str) -> Path:
    """Write the file readable by its owner alone (0600; its folder 0700), replacing it whole."""
    path = config_path()
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    partial = path.with_name(path.name + ".partial")
    partial.unlink(missing_ok=True)  # a leftover from an interrupted save: O_EXCL below must create it afresh
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump({"server": server, "token": token}, out)
        out.write("\n")
    os.replace(partial, path)
    return path


def forget() -> Path | None:
    """Delete the file; its path, or None when there was none."""
    path = config_path()
    try:
        path.unlink()
    except FileNotFoundError:
        return None
    return path

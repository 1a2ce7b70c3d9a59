"""The agent's credentials file (JSON, mode 0600): which site, which worker, and its key."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path


class ConfigError(RuntimeError):
    pass


def default_path() -> Path:
    base = os.environ.get("ECHO2_AGENT_CONFIG")
    if base:
        return Path(base)
    return Path(os.environ.get("XDG_CONFIG_HOME", Path.home() / ".config")) / "echo2" / "agent.json"


@dataclass
class AgentConfig:
    server: str
    worker_id: int
    name: str
    agent_key: str
    relay_address: str = ""
    """host:port registered for chain peers ('' : this machine is a tail only)."""
    bandwidth_bps: int | None = None
    """Registered link bandwidth B_w (bytes/s): the relay's up- and downlink cap."""
    allow_user_code: bool = False
    """Run job owners' code in this process (reward functions ``pkg.module:fn``, verifiers environments): the
    provider's opt-in, ``echo2-agent run --allow-user-code`` (or ``"allow_user_code": true`` here); off, a job whose
    task names user code is refused (docs/trust.md, "User code on workers"). The one place the agent keeps it: the
    session declares it in every hello (the site then assigns such jobs only to workers that opted in) and hands it
    to every task it builds (``TaskAdapter.prepare(allow_user_code=...)``), the last line of defence."""

    def save(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as fh:
            json.dump(asdict(self), fh, indent=2)
        os.chmod(tmp, 0o600)
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> AgentConfig:
        try:
            data = json.loads(path.read_text())
            return cls(**{k: data[k] for k in ("server", "worker_id", "name", "agent_key")},
                       relay_address=data.get("relay_address", ""), bandwidth_bps=data.get("bandwidth_bps"),
                       allow_user_code=data.get("allow_user_code", False) is True)
        except FileNotFoundError:
            raise ConfigError(f"no agent config at {path}; run `echo2-agent register` first") from None
        except (ValueError, KeyError, TypeError) as err:
            raise ConfigError(f"agent config {path} is unreadable ({err}); register again") from None

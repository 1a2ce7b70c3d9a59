"""The fault suite's stack (bench/bench_faults.py): the processes of one run and the template every run copies:
the model, a migrated database with two users and three registered agents."""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import httpx
from faults.base import LEASE_TIMEOUT_S, WORKER_TIMEOUT_S

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
AGENTS = ("a", "b", "c")
PRICE = 0.36  # USD/h, the same for every worker: the site's bill converts exactly into worker-seconds


@dataclass
class Setup:
    """What every run shares: the model, a migrated database with users and registered agents, ports."""

    workdir: Path
    args: argparse.Namespace
    model_dir: Path
    site_port: int
    tokens: dict[str, str]
    agents: dict[str, tuple[Path, str, int]]  # name -> (config, relay address, worker id)

    @property
    def server(self) -> str:
        return f"http://127.0.0.1:{self.site_port}"


def site_env(directory: Path, redis_port: int) -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=f"sqlite:///{directory / 'site.sqlite3'}", DEBUG="true",
                REDIS_URL=f"redis://127.0.0.1:{redis_port}/0", ECHO2_DATA_DIR=str(directory),
                DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
                ECHO2_WORKER_TIMEOUT_S=str(WORKER_TIMEOUT_S), ECHO2_LEASE_TIMEOUT_S=str(LEASE_TIMEOUT_S))


def redis_argv(directory: Path, port: int) -> tuple[str, ...]:
    directory.mkdir(parents=True, exist_ok=True)
    return (shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind", "127.0.0.1",
            "--save", "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(directory),
            "--auto-aof-rewrite-percentage", "0")  # no rewrite: the audit replays the whole history


def redis_up(port: int) -> bool:
    import redis

    client = redis.Redis(port=port, socket_timeout=1, socket_connect_timeout=1)
    try:
        return bool(client.ping())
    finally:
        client.close()


def site_up(server: str) -> bool:
    return httpx.get(server + "/api/schema/", timeout=2).status_code == 200


def prepare(workdir: Path, args: argparse.Namespace) -> Setup:
    """Build the model once, and a database template: migrated, users, three agents registered."""
    template = workdir / "template"
    template.mkdir(parents=True)
    redis_port, site_port = free_port(), free_port()
    stack = Stack(template, site_env(template, redis_port))
    try:
        model_dir = workdir / "tiny-arithmetic"
        stack.run(str(BIN / "echo2-learner"), "init-model", str(model_dir), "--task", "arithmetic")
        stack.start("redis", *redis_argv(template / "redis", redis_port))
        stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
        script = ("import json\nfrom django.contrib.auth.models import User\n"
                  "from marketplace.services import api_token_issue\n"
                  "print(json.dumps({n: api_token_issue(user=User.objects.create_user(n, password=n)) "
                  "for n in ('owner', 'provider')}))\n")
        out = stack.run(str(BIN / "python"), "manage.py", "shell", "-c", script)
        tokens = json.loads(out.strip().splitlines()[-1])
        stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(site_port), *DAPHNE_WEBSOCKET_LIMITS,
                    "echo2_site.asgi:application")
        setup = Setup(workdir, args, model_dir, site_port, tokens, {})
        wait_for(lambda: site_up(setup.server), "the site", 60)
        for name in AGENTS:
            cfg, relay = workdir / "agents" / f"{name}.json", f"127.0.0.1:{free_port()}"
            out = stack.run(str(BIN / "echo2-agent"), "register", "--server", setup.server, "--token",
                            tokens["provider"], "--name", f"agent-{name}", "--price", str(PRICE), "--bandwidth-mbps",
                            "100", "--relay-address", relay, "--config", str(cfg), "--json")
            setup.agents[name] = (cfg, relay, json.loads(out.strip().splitlines()[-1])["worker_id"])
        return setup
    finally:
        stack.stop()

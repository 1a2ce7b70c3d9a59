"""A live site for end-to-end tests: real daphne (and Celery) on loopback over a SQLite file and the test Redis.

The tests drive it like users do: the REST API, the CLIs and websockets.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import httpx

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for

BIN = Path(sys.executable).parent


def make_stack(tmp_path: Path, redis_url: str, **env: str) -> Stack:
    base = dict(os.environ, DATABASE_URL=f"sqlite:///{tmp_path / 'site.sqlite3'}", REDIS_URL=redis_url,
                ECHO2_DATA_DIR=str(tmp_path), DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", ECHO2_CHANNEL_PREFIX=f"echo2-{tmp_path.name}",
                ECHO2_CACHE_DIR=str(tmp_path / "agent-cache"),  # agents' base models: not the user's cache
                ECHO2_LOGDIR=str(tmp_path / "runs"),  # learners' TensorBoard logs: not the checkout's var/runs
                # No Redis users of learners on the machine's Redis (a test on a private one turns them on).
                ECHO2_LEARNER_REDIS_USERS="false")
    return Stack(tmp_path, base | env)


def create_users(stack: Stack, *names: str, setup: str = "") -> dict[str, str]:
    """Users (password = their name + '-pass') and their API tokens; ``setup`` runs after, in the same shell."""
    script = (
        "import json\nfrom django.contrib.auth.models import User\nfrom marketplace.services import api_token_issue\n"
        f"tokens = {{n: api_token_issue(user=User.objects.create_user(n, password=n + '-pass')) "
        f"for n in {list(names)!r}}}\n{setup}\nprint(json.dumps(tokens))\n"
    )
    stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
    return json.loads(stack.run(str(BIN / "python"), "manage.py", "shell", "-c", script).strip().splitlines()[-1])


def start_site(stack: Stack, *, celery: bool = True, host: str = "127.0.0.1") -> str:
    """daphne (and a solo Celery worker); returns the site's URL once it answers."""
    port = free_port()
    stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), *DAPHNE_WEBSOCKET_LIMITS,
                "echo2_site.asgi:application")
    if celery:
        stack.start("celery", str(BIN / "celery"), "-A", "echo2_site", "worker", "-P", "solo", "-l", "info")
    server = f"http://{host}:{port}"
    wait_for(lambda: httpx.get(server + "/api/schema/", timeout=2).status_code == 200, "the site", 60)
    return server


def api(server: str, token: str) -> httpx.Client:
    return httpx.Client(base_url=server + "/api/", headers={"Authorization": f"Token {token}"}, timeout=30)


def owner_site(stack: Stack, tmp_path: Path) -> tuple[str, httpx.Client, Path]:
    """A live site (no Celery) with one job owner, ``own``: the site's URL, the owner's API client, and the file
    holding the owner's token (private, as ``--token-file`` wants it)."""
    token = create_users(stack, "own")["own"]
    token_file = tmp_path / "token"
    token_file.write_text(token + "\n")
    token_file.chmod(0o600)
    server = start_site(stack, celery=False)
    return server, api(server, token), token_file


def start_learner(stack: Stack, server: str, job_id: int, token_file: Path, redis_url: str, *options: str):
    """``echo2-learner`` for ``job_id``, auditing nothing (tests feed made-up groups), with ``options`` after."""
    return stack.start("learner", str(BIN / "echo2-learner"), "--server", server, "--job", str(job_id),
                       "--token-file", str(token_file), "--redis", redis_url, "--audit-fraction", "0", *options)

"""The learner's command as the job page, ``echo2 job submit`` and the demo's hand-over print it: whole (the site,
the job, the token file; the site hands the learner its door to the streams), no placeholder, and it parses as
``echo2-learner``'s own options with no Redis URL (the demo runs exactly that command: ``make demo``)."""

from __future__ import annotations

import html
import re
import shlex

import pytest
import typer
from django.test import Client

from dataplane.learner_command import learner_command
from echo2_cli.render import learner_hint
from echo2_site.demo import BIN, PROVIDERS, ROOT
from echo2_site.demo_handover import handover_lines
from learner import cli
from learner.settings import LearnerSettings
from tests.marketplace import factories

PLACEHOLDER = re.compile(r"\b[A-Z][A-Z_]{2,}\b")  # TOKEN_FILE, REDIS_URL, URL, N: what a reader must replace


def parsed(command: str) -> LearnerSettings:
    """``command`` as echo2-learner reads it (click's own parser), the token file's content aside."""
    argv = shlex.split(command)
    assert argv[0].endswith("echo2-learner"), argv
    run = typer.main.get_command(cli.app).commands["run"]
    ctx = run.make_context("run", argv[1:])
    values = {k: v for k, v in ctx.params.items() if v is not None and k in LearnerSettings.model_fields}
    return LearnerSettings(**{**values, "token_file": None, "token": "e2u_x"})


def test_the_command_quotes_what_a_shell_would_split_and_leaves_the_home_to_the_shell() -> None:
    assert learner_command(server="https://site.example/", job_id=7) == (
        "echo2-learner --server https://site.example --job 7 --token-file ~/.echo2-token")
    odd = learner_command(server="http://h:1", job_id=2, token_file="/tmp/my tokens/t")
    assert shlex.split(odd)[-1] == "/tmp/my tokens/t"


@pytest.mark.django_db
def test_the_job_page_prints_the_whole_command(redis_url) -> None:
    owner = factories.user()
    job = factories.job(owner)
    browser = Client()
    browser.force_login(owner)
    page = browser.get(f"/jobs/{job.pk}/").content.decode()
    command = html.unescape(re.search(r'<code id="learner-command">(.*?)</code>', page).group(1))
    assert command == f"echo2-learner --server http://testserver --job {job.pk} --token-file ~/.echo2-token"
    assert not PLACEHOLDER.search(command) and "--redis" not in command
    settings = parsed(command)
    assert (settings.server, settings.job, settings.redis_url) == ("http://testserver", job.pk, None)


def test_echo2_job_submit_prints_the_whole_command_with_the_token_file_it_used() -> None:
    used = learner_hint({"id": 4, "status": "running"}, "http://site:8000", "/home/o/.config/echo2/token")
    command = used.splitlines()[1].strip()
    assert command == "echo2-learner --server http://site:8000 --job 4 --token-file /home/o/.config/echo2/token"
    assert parsed(command).job == 4 and not PLACEHOLDER.search(command)
    told = learner_hint({"id": 5, "status": "draft"}, "http://site:8000")
    assert "your API token in ~/.echo2-token" in told.splitlines()[0]
    assert parsed(told.splitlines()[1]).redis_url is None


def test_the_demo_hands_over_the_command_it_ran_its_learner_with(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    lines = handover_lines(server="http://127.0.0.1:8123", job_id=1, workdir=ROOT / "var" / "demo", bin_dir=BIN,
                           providers=[p[0] for p in PROVIDERS], keep_running=False)
    [line] = [line for line in lines if "echo2-learner --server" in line]
    assert line.strip().startswith(".venv/bin/echo2-learner --server http://127.0.0.1:8123 --job 1 --token-file "
                                   "var/demo/tokens/demo --snapshot-dir var/demo/snapshots")
    settings = parsed(line.strip())
    assert settings.redis_url is None and not PLACEHOLDER.search(line)

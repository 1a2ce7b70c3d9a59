"""``echo2 login`` / ``logout`` against a live site: the token checked before it is saved, the config file mode 600,
later commands need neither --server nor a token, the saved token never goes to another site; ``submit`` says the
learner must be started and how; a misspelt task option is one line."""

from __future__ import annotations

import json
import stat

import pytest

from ..marketplace import factories
from .test_cli import JOB, echo2, one_line_error


@pytest.fixture
def config_env(tmp_path):
    return {"XDG_CONFIG_HOME": str(tmp_path / "config")}


@pytest.mark.django_db(transaction=True)
def test_login_saves_a_checked_token_that_later_commands_use(live_server, tmp_path, config_env, settings) -> None:
    settings.CELERY_TASK_ALWAYS_EAGER = True
    token = factories.token(factories.user("owner"))
    saved = tmp_path / "config" / "echo2" / "config.json"

    wrong = echo2("login", "--server", live_server.url, env=config_env, input="e2u_wrong\n")
    assert one_line_error(wrong, 1) == (
        f"login to {live_server.url} failed, nothing saved: GET /api/jobs/: Invalid token.")
    assert not saved.exists()

    done = echo2("login", "--server", live_server.url, env=config_env, input=token + "\n")
    assert done.returncode == 0, done.stderr
    assert f"logged in to {live_server.url}; saved to {saved} (mode 600)" in done.stdout
    assert stat.S_IMODE(saved.stat().st_mode) == 0o600
    assert json.loads(saved.read_text()) == {"server": live_server.url, "token": token}

    (tmp_path / "job.toml").write_text(JOB.format(model_dir=factories.checkpoint_dir()))
    submitted = echo2("job", "submit", str(tmp_path / "job.toml"), env=config_env)  # no --server, no token
    assert submitted.returncode == 0, submitted.stderr
    job_id = json.loads(echo2("job", "list", "--json", env=config_env).stdout)[0]["id"]
    assert f"job {job_id} is waiting for its learner" in submitted.stdout
    assert f"echo2-learner --server {live_server.url} --job {job_id} --token-file" in submitted.stdout

    elsewhere = echo2("job", "list", "--server", "http://127.0.0.1:9", env=config_env)  # the token stays home
    assert one_line_error(elsewhere, 1).startswith("no API token: run `echo2 login`")

    assert echo2("logout", env=config_env).stdout.strip() == f"logged out: deleted {saved}"
    assert not saved.exists()
    assert one_line_error(echo2("job", "list", env=config_env), 1).startswith("no API token")


def test_login_without_a_token_or_with_an_unreadable_file_is_one_line(tmp_path, config_env) -> None:
    assert one_line_error(echo2("login", env=config_env, input=""), 2) == (
        "login: no token given (on stdin, at the prompt, or with --token-file PATH)")
    missing = echo2("login", "--token-file", str(tmp_path / "nope"), env=config_env)
    assert one_line_error(missing, 2).startswith(f"--token-file: cannot read {tmp_path / 'nope'}")
    assert not (tmp_path / "config").exists()


def test_a_misspelt_task_option_is_one_line_naming_the_nearest_option(tmp_path) -> None:
    (tmp_path / "job.toml").write_text(JOB.format(model_dir=tmp_path).replace(
        'name = "arithmetic"', 'name = "arithmetic"\nmax_operandd = 20'))
    refused = one_line_error(echo2("job", "submit", str(tmp_path / "job.toml"), "--dry-run"), 2)
    assert "task: arithmetic: unknown option 'max_operandd' (did you mean 'max_operand'?)" in refused

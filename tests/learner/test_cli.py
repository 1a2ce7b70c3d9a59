"""``echo2-learner run``'s options are LearnerSettings' fields: the flags and variables users and deployments
type reach the settings, a bad value is one error line and a non-zero exit, and `--server ...` means `run`."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from dataplane.jobs import JobStatus
from learner import cli
from learner.settings import LearnerSettings

FLAGS = ["--server", "--job", "--token", "--redis", "--snapshot-dir", "--snapshot-host", "--snapshot-port",
         "--advertise-host", "--relay", "--no-relay", "--relay-port", "--relay-mode", "--data-timeout", "--device",
         "--checkpoint-dir", "--checkpoint-every", "--micro-batch", "--bf16", "--parallel",
         "--activation-checkpointing", "--site-timeout", "--debug"]
REQUIRED = ["--server", "http://site", "--job", "3", "--token", "tok"]


@pytest.fixture
def trained(monkeypatch) -> list[LearnerSettings]:
    """The settings ``run`` hands to the trainer (which trains nothing here)."""
    seen: list[LearnerSettings] = []

    def run_job(site, settings: LearnerSettings) -> JobStatus:
        seen.append(settings)
        return JobStatus.COMPLETED

    monkeypatch.setattr("learner.trainer.run_job", run_job)
    for name in ("ECHO2_SERVER", "ECHO2_JOB", "ECHO2_TOKEN", "ECHO2_TOKEN_FILE", "ECHO2_LEARNER_REDIS_URL",
                 "ECHO2_REDIS_CA", "ECHO2_LOGDIR", "WANDB_PROJECT", "WANDB_NAME", "WANDB_TAGS",
                 "ECHO2_LEARNER_RELAY_MODE"):
        monkeypatch.delenv(name, raising=False)
    return seen


def invoke(*args: str, env: dict[str, str] | None = None):
    return CliRunner().invoke(cli.app, ["run", *args], env=env)


def test_every_setting_is_an_option_of_run_with_its_variable() -> None:
    run = typer.main.get_command(cli.app).commands["run"]
    options = {opt for param in run.params for opt in [*param.opts, *param.secondary_opts]}
    assert set(FLAGS) <= options
    envvars = {param.name: param.envvar for param in run.params if param.envvar}
    assert envvars == {"server": "ECHO2_SERVER", "job": "ECHO2_JOB", "token": "ECHO2_TOKEN",
                       "token_file": "ECHO2_TOKEN_FILE", "redis_url": "ECHO2_LEARNER_REDIS_URL",
                       "redis_ca": "ECHO2_REDIS_CA", "logdir": "ECHO2_LOGDIR",
                       "wandb_project": "WANDB_PROJECT", "wandb_name": "WANDB_NAME", "wandb_tags": "WANDB_TAGS",
                       "relay_mode": "ECHO2_LEARNER_RELAY_MODE"}
    assert {param.name for param in run.params} - {"help"} == set(LearnerSettings.model_fields)


def test_flags_reach_the_settings(trained) -> None:
    result = invoke(*REQUIRED, "--redis", "redis://r:6379/2", "--snapshot-dir", "/tmp/s", "--no-relay",
                    "--data-timeout", "4", "--checkpoint-every", "2", "--micro-batch", "8", "--site-timeout", "3")
    assert result.exit_code == 0, result.output
    assert result.output.strip().endswith("job 3: completed")
    [s] = trained
    assert (s.server, s.job, s.token, s.redis_url) == ("http://site", 3, "tok", "redis://r:6379/2")
    assert (s.snapshot_dir, s.relay, s.data_timeout_s, s.checkpoint_every, s.micro_batch, s.site_timeout_s) == (
        Path("/tmp/s"), False, 4.0, 2, 8, 3.0)
    assert (s.device, s.bf16, s.checkpoint_dir, s.status_poll_s) == ("cpu", False, None, 10.0)  # the defaults
    assert s.relay_mode == "process"


def test_environment_variables_reach_the_settings(trained) -> None:
    env = {"ECHO2_SERVER": "http://env", "ECHO2_JOB": "7", "ECHO2_TOKEN": "t", "ECHO2_LEARNER_REDIS_URL": "redis://e/1"}
    assert invoke(env=env).exit_code == 0
    assert (trained[0].server, trained[0].job, trained[0].redis_url) == ("http://env", 7, "redis://e/1")
    assert invoke("--job", "8", env=env).exit_code == 0 and trained[1].job == 8  # a flag beats the variable


def test_the_site_hands_the_learner_its_streams_unless_overridden(trained) -> None:
    """The whole command is --server, --job and --token-file: no Redis URL (the site's door), and the site's own
    REDIS_URL in the environment is not taken for one (it would bypass the door)."""
    assert invoke(*REQUIRED, env={"REDIS_URL": "redis://site-internal:6379/0"}).exit_code == 0
    assert trained[0].redis_url is None and trained[0].saved()["redis_url"] is None


def test_the_model_reads_only_the_variables_it_declares(monkeypatch) -> None:
    monkeypatch.setenv("ECHO2_SERVER", "http://env")
    monkeypatch.setenv("ECHO2_JOB", "5")
    monkeypatch.setenv("ECHO2_TOKEN", "s3cret")
    monkeypatch.setenv("DEVICE", "cuda")
    monkeypatch.setenv("DEBUG", "true")
    settings = LearnerSettings()
    assert (settings.server, settings.job, settings.device, settings.debug) == ("http://env", 5, "cpu", False)
    assert settings.token == "s3cret" and "s3cret" not in repr(settings) and "token" not in settings.saved()


@pytest.mark.parametrize("args, words", [
    (["--job", "x"], "Invalid value for '--job'"),
    (["--checkpoint-every", "0"], "Invalid value for '--checkpoint-every'"),
    (["--status-poll", "0"], "Invalid value for '--status-poll': Input should be greater than 0"),
    (["--colour", "blue"], "No such option: --colour"),
    (["--parallel", "zero"], "Invalid value for '--parallel': Value error, 'zero' is not one of 'ddp', 'fsdp'"),
])
def test_a_bad_flag_is_one_error_line_and_a_non_zero_exit(trained, args: list[str], words: str) -> None:
    result = invoke(*REQUIRED, *args)
    assert result.exit_code == 2 and not trained
    errors = [line for line in result.output.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and words in errors[0], result.output


def test_a_missing_option_is_named(trained) -> None:
    result = invoke("--server", "http://site", "--token", "t")
    assert result.exit_code == 2 and "Missing option '--job'" in result.output


def test_options_without_a_command_mean_run(trained, monkeypatch) -> None:
    monkeypatch.setattr(sys, "argv", ["echo2-learner", *REQUIRED, "--device", "cpu"])
    with pytest.raises(SystemExit) as done:
        cli.main()
    assert done.value.code == 0 and trained[0].job == 3


def test_a_missing_model_dir_is_one_error_line_not_a_hub_error(monkeypatch, tmp_path) -> None:
    job = {"id": 3, "status": "running", "name": "j", "model_dir": str(tmp_path / "not-here"),
           "task": {"name": "arithmetic"}, "batch_trajectories": 8, "group_size": 4}
    monkeypatch.setattr("learner.client.SiteClient.job", lambda self, job_id: job)
    result = invoke(*REQUIRED[:-2], "--snapshot-dir", str(tmp_path / "snapshots"), env={"ECHO2_TOKEN": "tok"})
    assert result.exit_code == 1
    assert result.output.strip().splitlines() == [
        f"echo2-learner: error: model_dir: no directory {tmp_path / 'not-here'} on this machine"]


def test_the_token_comes_from_a_file_or_the_environment_and_on_the_command_line_is_warned_about(trained, tmp_path):
    secret = tmp_path / "token"
    secret.write_text("e2u_from_the_file\n")
    base = ["--server", "http://site", "--job", "3"]
    quiet = CliRunner().invoke(cli.app, ["run", *base, "--token-file", str(secret)])
    assert quiet.exit_code == 0 and "warning" not in quiet.stderr and trained[-1].token == "e2u_from_the_file"
    env = CliRunner().invoke(cli.app, ["run", *base], env={"ECHO2_TOKEN": "e2u_env"})
    assert env.exit_code == 0 and "warning" not in env.stderr and trained[-1].token == "e2u_env"
    by_env_file = CliRunner().invoke(cli.app, ["run", *base], env={"ECHO2_TOKEN_FILE": str(secret)})
    assert by_env_file.exit_code == 0 and trained[-1].token == "e2u_from_the_file"
    loud = CliRunner().invoke(cli.app, ["run", *base, "--token", "e2u_argv"])
    assert loud.exit_code == 0 and trained[-1].token == "e2u_argv"
    assert "echo2-learner: warning: --token on the command line shows in `ps`" in loud.stderr


@pytest.mark.parametrize("extra, words", [
    ([], "no API token: give --token-file PATH (or ECHO2_TOKEN_FILE), or ECHO2_TOKEN"),
    (["--token-file", "/no/such/file"], "--token-file: cannot read /no/such/file"),
])
def test_a_missing_or_unreadable_token_is_one_error_line(trained, extra, words):
    result = invoke("--server", "http://site", "--job", "3", *extra)
    assert result.exit_code == 2 and not trained and words in result.output, result.output

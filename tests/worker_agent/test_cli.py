"""``echo2-agent`` as a user runs it: one clear line and a non-zero exit on bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from ..marketplace import factories

AGENT = str(Path(sys.executable).parent / "echo2-agent")


def agent(*args: str, config: Path | None = None, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    argv = [AGENT, *args] + (["--config", str(config)] if config else [])
    clean = {k: v for k, v in os.environ.items() if k not in ("ECHO2_TOKEN", "ECHO2_TOKEN_FILE")}
    # The limit catches a hung agent, not a slow one: on a loaded CI machine an agent's start alone can take a minute.
    return subprocess.run(argv, capture_output=True, text=True, timeout=300, env=clean | (env or {}))


def test_bad_price_and_missing_config_fail_with_one_line(tmp_path):
    done = agent("register", "--server", "http://127.0.0.1:9", "--price", "-1", env={"ECHO2_TOKEN": "t"})
    assert done.returncode == 1 and done.stderr.strip() == "echo2-agent: error: --price must be > 0 USD per hour"
    done = agent("run", config=tmp_path / "none.json")
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        f"echo2-agent: error: no agent config at {tmp_path / 'none.json'}; run `echo2-agent register` first"]


def test_unreachable_site_is_one_line(tmp_path):
    done = agent("register", "--server", "http://127.0.0.1:9", "--price", "0.3", config=tmp_path / "a.json",
                 env={"ECHO2_TOKEN": "t"})
    assert done.returncode == 1 and done.stderr.startswith("echo2-agent: error: cannot reach http://127.0.0.1:9")
    assert len(done.stderr.strip().splitlines()) == 1 and not (tmp_path / "a.json").exists()


@pytest.mark.django_db(transaction=True)
def test_register_against_a_live_site(live_server, tmp_path):
    token = factories.token(factories.user("prov"))
    refused = agent("register", "--server", live_server.url, "--token", "wrong", "--price", "0.3",
                    config=tmp_path / "a.json")
    assert refused.returncode == 1 and "registration refused (401): Invalid token." in refused.stderr

    done = agent("register", "--server", live_server.url, "--token", token, "--price", "0.35", "--name", "rig-7",
                 "--bandwidth-mbps", "80", "--json", config=tmp_path / "a.json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["name"] == "rig-7"
    saved = json.loads((tmp_path / "a.json").read_text())
    assert saved["agent_key"].startswith("e2w_") and saved["server"] == live_server.url
    assert (tmp_path / "a.json").stat().st_mode & 0o777 == 0o600

    duplicate = agent("register", "--server", live_server.url, "--token", token, "--price", "0.35", "--name",
                      "rig-7", config=tmp_path / "b.json")
    assert duplicate.returncode == 1 and "already have a worker named 'rig-7'" in duplicate.stderr


def test_the_token_comes_from_a_file_and_on_the_command_line_is_warned_about(tmp_path):
    secret = tmp_path / "token"
    secret.write_text("e2u_x\n")
    base = ["register", "--server", "http://127.0.0.1:9", "--price", "0.3"]
    quiet = agent(*base, "--token-file", str(secret), config=tmp_path / "a.json")
    assert quiet.returncode == 1 and "warning" not in quiet.stderr and "cannot reach" in quiet.stderr
    loud = agent(*base, "--token", "e2u_x", config=tmp_path / "a.json")
    assert loud.stderr.startswith("echo2-agent: warning: --token on the command line shows in `ps`")
    missing = agent(*base, config=tmp_path / "a.json")
    assert missing.returncode == 1 and missing.stderr.strip() == (
        "echo2-agent: error: no API token: give --token-file PATH (or ECHO2_TOKEN_FILE), or ECHO2_TOKEN")
    unreadable = agent(*base, "--token-file", str(tmp_path / "none"), config=tmp_path / "a.json")
    assert unreadable.returncode == 1 and "--token-file: cannot read" in unreadable.stderr


@pytest.mark.django_db(transaction=True)
def test_bench_measures_and_reports_a_calibration(live_server, tmp_path, tiny_model_dir):
    from marketplace.models import WorkerCalibration

    token = factories.token(factories.user("bench-prov"))
    cfg = tmp_path / "a.json"
    registered = agent("register", "--server", live_server.url, "--token", token, "--price", "0.3", config=cfg)
    assert registered.returncode == 0
    done = agent("bench", "--model", str(tiny_model_dir), "--seconds", "0.5", "--max-new-tokens", "2", "--threads",
                 "1", "--report", "--json", config=cfg)
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["throughput"] > 0 and result["reported"] is True
    saved = WorkerCalibration.objects.get()
    assert saved.model_dir == str(tiny_model_dir) and saved.throughput == pytest.approx(result["throughput"])

    bad = agent("bench", "--model", str(tiny_model_dir), "--task", '{"name": "zzz"}', config=cfg)
    assert bad.returncode == 1 and "unknown task 'zzz'" in bad.stderr


def test_bench_needs_no_model(tmp_path):
    """A provider holds no model: without --model the bench makes a tiny one for the task and measures it; a
    calibration (--report) is of a job's model, so it asks for --model."""
    done = agent("bench", "--seconds", "0.3", "--max-new-tokens", "2", "--threads", "1", "--json",
                 config=tmp_path / "none.json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["throughput"] > 0 and result["model"].endswith("/tiny") and not Path(result["model"]).exists()
    refused = agent("bench", "--report", config=tmp_path / "none.json")
    assert refused.returncode == 1 and "--report needs --model" in refused.stderr

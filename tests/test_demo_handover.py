"""What ``make demo`` prints when its job ends (echo2_site/demo_handover.py): the dashboard and its logins, the owner's
token file and commands that run as printed from the checkout; whether the site stays up, or how to keep it."""

from __future__ import annotations

import shlex

from echo2_site.demo import BIN, PROVIDERS, ROOT
from echo2_site.demo_handover import handover_lines


def test_the_hand_over_names_the_token_logins_and_commands_relative_to_the_checkout(monkeypatch) -> None:
    monkeypatch.chdir(ROOT)
    lines = handover_lines(server="http://127.0.0.1:8123", job_id=1, workdir=ROOT / "var" / "demo", bin_dir=BIN,
                           providers=[p[0] for p in PROVIDERS], keep_running=False)
    text = "\n".join(lines)
    assert "http://127.0.0.1:8123/jobs/1/  (owner login: demo / demo" in text
    assert "alice / alice, bob / bob, carol / carol" in text
    assert "owner's token    var/demo/tokens/demo  (mode 600" in text
    assert "export ECHO2_SERVER=http://127.0.0.1:8123 ECHO2_TOKEN_FILE=var/demo/tokens/demo" in text
    commands = [shlex.split(line) for line in lines if line.startswith("  ")]
    programs = [c[0] for c in commands if c[0] != "export"]
    assert programs and all(not p.startswith("/") and (ROOT / p).exists() for p in programs), programs
    assert [c[1:4] for c in commands if c[0].endswith("/echo2")] == [["job", "status", "1"], ["job", "samples", "1"]]
    assert "--snapshot-dir var/demo/snapshots --out var/demo/export-job1" in text
    assert lines[-1].endswith("to keep it up until Ctrl-C: make demo DEMO_ARGS=--keep-running")
    assert "DEMO_ARGS" in (ROOT / "Makefile").read_text()


def test_kept_running_the_hand_over_says_ctrl_c_stops_it() -> None:
    lines = handover_lines(server="http://h:1", job_id=2, workdir=ROOT / "var" / "demo", bin_dir=BIN,
                           providers=["alice"], keep_running=True)
    assert lines[-1] == "the site stays up at http://h:1 until Ctrl-C, which stops every demo process"

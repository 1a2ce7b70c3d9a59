"""The agent's status lines (worker_agent/status.py): what each situation says, and a pace that tells every change
without flooding: a line per change (never two within MIN_GAP_S), progress every PROGRESS_EVERY_S, a summary every
``every`` seconds. Clock values are passed in, so nothing here waits. The session's own lines: test_session.py (in
process) and test_run_status.py (`echo2-agent run` against a live site)."""

from __future__ import annotations

import json
from types import SimpleNamespace

from dataplane.broadcast.relay import SnapshotRelay
from dataplane.snapshot import ManifestReference
from worker_agent.status import MIN_GAP_S, Install, Reporter, Tally, View, describe, due, status_lines, write_status


def text(view: View) -> str:
    status = describe(view)
    assert status is not None
    return status.text


def test_each_situation_says_what_the_agent_does_and_why_it_idles():
    assert describe(View(connected=False, state="idle")) is None  # the session says when it reconnects
    assert text(View(connected=True, state="idle")) == (
        "idle: not activated (waiting for the scheduler to pick this machine)")
    assert text(View(connected=True, state="idle", released="released from job 3: job paused")) == (
        "idle: not activated (released from job 3: job paused)")
    assert text(View(connected=True, state="idle", job_id=3)).startswith("idle: job 3's base snapshot is not here")
    assert text(View(connected=True, state="loading", job_id=3, installs=(Install(0, 4.2, 12, 40),))) == (
        "loading job 3's model: base snapshot, 12/40 chunks, 4 s")
    assert text(View(connected=True, state="loading", job_id=3, installs=(Install(0, 75, 40, 40),))) == (
        "loading job 3's model: base snapshot, downloaded, 75 s")
    assert text(View(connected=True, state="installing", job_id=3, version=6, installs=(Install(7, 1),))) == (
        "installing v7 for job 3: under way, 1 s")
    assert text(View(connected=True, state="generating", job_id=3, version=6, installs=(Install(7, 1),))) == (
        "generating for job 3 under v6; installing v7")
    assert text(View(connected=True, state="idle", job_id=3, version=6, wanted=8)) == (
        "idle: waiting for snapshot v8 of job 3 (v6 installed; asking the site)")
    assert text(View(connected=True, state="idle", job_id=3, version=6, no_work=True)).startswith(
        "idle: job 3 has no prompts to lease")
    assert text(View(connected=True, state="failed", job_id=3, failure="TimeoutError")) == (
        "job 3: the rollout loop failed (TimeoutError); restarting it")


def test_between_batches_a_worker_that_just_delivered_is_still_generating():
    between = View(connected=True, state="idle", job_id=3, version=6, no_work=True, recent_work=True)
    assert describe(between).key == describe(View(connected=True, state="generating", job_id=3, version=6)).key


def test_pace_a_change_at_once_but_never_two_lines_within_the_gap_and_a_summary_every_period():
    idle = describe(View(connected=True, state="idle"))
    busy = describe(View(connected=True, state="generating", job_id=1, version=0))
    assert due(idle, last=None, last_at=None, now=0.0, every=30)
    assert not due(busy, last=idle, last_at=0.0, now=MIN_GAP_S - 0.1, every=30)
    assert due(busy, last=idle, last_at=0.0, now=MIN_GAP_S, every=30)
    assert not due(idle, last=idle, last_at=0.0, now=29.9, every=30)
    assert due(idle, last=idle, last_at=0.0, now=30.0, every=30)
    assert not due(idle, last=idle, last_at=0.0, now=1e6, every=0)  # --status-every 0: changes only


def test_download_progress_at_most_every_few_seconds():
    def loading(chunks: int) -> View:
        return View(connected=True, state="loading", job_id=1, installs=(Install(0, chunks, chunks, 100),))

    reporter, lines = Reporter(every=30), []
    for tick in range(40):  # one new chunk a second, the reporter polled every second
        line = reporter.line(loading(tick), Tally(), float(tick))
        lines += [line] if line else []
    assert len(lines) == 8 and lines[1] == "loading job 1's model: base snapshot, 5/100 chunks, 5 s"


def test_a_flapping_state_prints_no_more_than_a_line_per_gap_and_summaries_carry_rates():
    reporter, tally, lines = Reporter(every=10), Tally(), []
    views = [View(connected=True, state="generating" if tick % 2 else "failed", job_id=1, version=2,
                  failure="boom") for tick in range(20)]
    for tick, view in enumerate(views):  # the state changes at every poll, twice a second
        line = reporter.line(view, tally, tick / 2)
        lines += [line] if line else []
    assert len(lines) <= 10 / MIN_GAP_S + 1

    reporter, lines = Reporter(every=10), []
    for tick in range(41):  # generating steadily for 20 s: a group of 8 trajectories, 64 tokens, every second
        if tick % 2 == 0:
            tally.groups, tally.trajectories, tally.tokens = tally.groups + 1, tally.trajectories + 8, tally.tokens + 64
        line = reporter.line(View(connected=True, state="generating", job_id=1, version=2), tally, tick / 2)
        lines += [line] if line else []
    assert lines[0] == "generating for job 1 under v2"
    assert lines[1] == ("generating for job 1 under v2: 1.00 groups/s (8.0 trajectories/s), 64 tokens/s over the last "
                        f"10 s; {tally.groups - 10} groups in all")
    assert len(lines) == 3


def test_a_repeated_idle_line_says_for_how_long_and_a_reconnection_starts_afresh():
    reporter, idle = Reporter(every=30), View(connected=True, state="idle")
    assert reporter.line(idle, Tally(), 0.0).startswith("idle: not activated")
    assert reporter.line(idle, Tally(), 10.0) is None
    assert reporter.line(idle, Tally(), 150.0).endswith("machine), for 2 min")
    assert reporter.line(View(connected=False, state="idle"), Tally(), 151.0) is None
    assert reporter.line(idle, Tally(), 151.5) == "idle: not activated (waiting for the scheduler to pick this machine)"



def test_the_summary_and_echo2_agent_status_say_what_the_sites_ledger_billed(tmp_path):
    """Earnings are the site's figure (each submit's answer carries it), never the agent's own arithmetic."""
    reporter, tally = Reporter(every=10), Tally(groups=1, trajectories=8, tokens=64)
    generating = View(connected=True, state="generating", job_id=1, version=2)
    assert reporter.line(generating, tally, 0.0) == "generating for job 1 under v2"
    tally.earned_usd = 0.0125
    assert reporter.line(generating, tally, 10.0).endswith("; 1 groups in all; earned $0.0125 (the site's ledger)")
    write_status(tmp_path / "agent.status.json", generating, tally)
    data = json.loads((tmp_path / "agent.status.json").read_text())
    assert status_lines(data, 1.0)[-1] == "earned: $0.0125, what the site's ledger billed for this worker so far"
    del data["earned_usd"]  # an agent whose site sent none says nothing about earnings
    assert not any("earned" in line for line in status_lines(data, 1.0))


def test_an_install_whose_relay_waits_for_its_manifest_has_no_total_yet():
    # a chain child's relay starts with the manifest's reference only (the parent's accept brings the manifest):
    # the status line must not fail on it (the reporter stopped with AttributeError in a demo run)
    relay = SnapshotRelay(None, worker_id=1, reference=ManifestReference("ab" * 32, 100), job_id=3, version=7)
    session = SimpleNamespace(installs=SimpleNamespace(installing={(3, 7)}), relaying={(3, 7): relay})
    assert Reporter(every=30).installs(session, 3, now=5.0) == (Install(version=7, seconds=0.0, chunks=0, total=None),)

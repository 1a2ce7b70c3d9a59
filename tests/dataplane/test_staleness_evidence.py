"""The staleness evidence table (dataplane/staleness_evidence.py): which row speaks for a job's S and correction,
the warning where the region was measured unstable, and the checks that keep the table consistent."""

from __future__ import annotations

import pytest

from dataplane import staleness_evidence as se
from dataplane.staleness_evidence import EVIDENCE, Evidence, evidence_for, guidance


def test_every_correction_a_job_can_choose_is_known_to_the_table() -> None:
    assert se.CORRECTIONS == ("behaviour", "tis", "mis", "decoupled", "none")


@pytest.mark.parametrize(("staleness", "correction", "verdict"), [
    (2, "behaviour", "good"), (6, "behaviour", "good"), (7, "behaviour", "slow"), (11, "behaviour", "slow"),
    (2, "tis", "slow"), (3, "tis", "slow"), (4, "tis", "unstable"), (11, "tis", "unstable"), (1000, "tis", "unstable"),
    (3, "mis", "slow"), (6, "mis", "unstable"), (3, "decoupled", "slow"), (6, "decoupled", "unstable"),
    (2, "none", "unstable"), (6, "none", "unstable"), (11, "none", "unstable"),
])
def test_the_row_for_a_budget_and_correction(staleness: int, correction: str, verdict: str) -> None:
    assert guidance(staleness=staleness, correction=correction)["verdict"] == verdict


def test_a_warning_only_where_unstable_naming_what_did_better() -> None:
    assert guidance(staleness=3, correction="behaviour")["warning"] is None
    assert guidance(staleness=3, correction="tis")["warning"] is None  # slower, not unstable: measured, not warned
    at_six = guidance(staleness=6, correction="tis")
    assert at_six["better"] == ["behaviour"]
    assert "Measured good at this S: off_policy = behaviour." in at_six["warning"]
    beyond = guidance(staleness=11, correction="tis")  # behaviour is slower there (+40%) but reaches the target
    assert beyond["better"] == []
    assert "Measured slower but stable at this S: off_policy = behaviour; or a smaller S." in beyond["warning"]
    assert beyond["warning"].endswith('See docs/learner.md, "Staleness and corrections, measured".')
    assert "Choose a smaller S." in guidance(staleness=11, correction="none", rows=tuple(
        row for row in EVIDENCE if row.correction == "none"))["warning"]  # nothing else measured: a smaller S
    unmeasured = guidance(staleness=3, correction="mis", rows=tuple(row for row in EVIDENCE if row.correction == "tis"))
    assert (unmeasured["verdict"], unmeasured["figure"], unmeasured["warning"]) == ("unmeasured", None, None)


def test_an_unknown_correction_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown off-policy correction 'vtrace'; known: behaviour, tis"):
        evidence_for(3, "vtrace")


def test_every_row_is_the_sweeps_and_every_correction_is_measured() -> None:
    assert {row.source for row in EVIDENCE} == {se.SWEEP}
    assert {row.correction for row in EVIDENCE} == set(se.CORRECTIONS)
    assert evidence_for(6, "behaviour").figure.startswith("S = 6: 262 [237, 284] updates to 0.8, +10% [-9%, +23%]")


@pytest.mark.parametrize(("rows", "message"), [
    ((Evidence("vtrace", 2, 3, "good", "x", "y"),), "unknown correction 'vtrace'"),
    ((Evidence("tis", 5, 3, "good", "x", "y"),), "bad range S = 5..3"),
    ((Evidence("tis", 1, 3, "good", "x", "y"),), "bad range S = 1..3"),
    ((Evidence("tis", 2, 6, "good", "x", "y"), Evidence("tis", 4, None, "unstable", "x", "y")),
     "two rows for tis cover S = 4"),
    ((Evidence("tis", 2, None, "good", "x", "y"), Evidence("tis", 4, 5, "unstable", "x", "y")),
     "two rows for tis cover S = 4"),
])
def test_an_inconsistent_table_is_refused(rows, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        se._check(rows)

"""The staleness evidence table (dataplane/staleness_evidence.py): which row speaks for a job's S and correction,
the warning where the region was measured unstable, and the checks that keep the table consistent."""

from __future__ import annotations

import pytest

from dataplane import staleness_evidence as se
from dataplane.staleness_evidence import EVIDENCE, Evidence, evidence_for, guidance


def test_every_correction_a_job_can_choose_is_known_to_the_table() -> None:
    assert se.CORRECTIONS == ("behaviour", "tis", "mis", "decoupled", "none")


@pytest.mark.parametrize(("staleness", "correction", "verdict"), [
    (2, "tis", "good"), (3, "tis", "unmeasured"), (9, "tis", "unmeasured"), (10, "tis", "unstable"),
    (11, "tis", "unstable"), (1000, "tis", "unstable"),
    (2, "behaviour", "good"), (10, "behaviour", "good"), (11, "behaviour", "unmeasured"),
    (5, "none", "unmeasured"), (6, "none", "unstable"), (9, "none", "unstable"), (11, "none", "unstable"),
    (3, "mis", "unmeasured"), (3, "decoupled", "unmeasured"),
])
def test_the_row_for_a_budget_and_correction(staleness: int, correction: str, verdict: str) -> None:
    assert guidance(staleness=staleness, correction=correction)["verdict"] == verdict


def test_a_warning_only_where_unstable_naming_what_did_better() -> None:
    assert guidance(staleness=3, correction="behaviour")["warning"] is None
    assert guidance(staleness=5, correction="mis")["warning"] is None  # nothing measured: nothing claimed
    at_ten = guidance(staleness=10, correction="tis")
    assert at_ten["better"] == ["behaviour"]
    assert "Measured good at this S: off_policy = behaviour." in at_ten["warning"]
    beyond = guidance(staleness=11, correction="tis")  # nothing measured good beyond lag 10
    assert beyond["better"] == [] and "Choose a smaller S." in beyond["warning"]
    assert beyond["warning"].endswith('See docs/learner.md, "Staleness and corrections, measured".')


def test_an_unknown_correction_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="unknown off-policy correction 'vtrace'; known: behaviour, tis"):
        evidence_for(3, "vtrace")


def test_the_seeded_rows_are_issue_32s_and_issue_17s() -> None:
    assert {row.source for row in EVIDENCE} == {se.ISSUE_32, se.ISSUE_17}
    assert evidence_for(11, "tis").figure.startswith("lags 0..10: 506 ± 167 updates to 0.8, +103%")


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

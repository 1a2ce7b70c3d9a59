"""What measurements say about learning under staleness, per off-policy correction and staleness budget ``S``.

The plan API (``GET /api/jobs/<id>/plan/``, ``POST /api/jobs/plan/``) and the launch page read this table to tell
a job owner, before launching, what was measured for the chosen ``S`` and ``loss.off_policy``, and to warn when
that region was found unstable. The measurements themselves, with their intervals and the command that reproduces
them, are in docs/learner.md ("Staleness and corrections, measured"), produced by ``bench/bench_staleness.py``;
this module holds the verdicts drawn from them. Whoever re-runs the sweep updates :data:`EVIDENCE` with it.

How a row's range of ``S`` is drawn: a job with budget ``S`` may train on lags ``0..S`` (the learner drops records
with ``v < v_t - S``), so a run with lags ``0..L`` speaks for ``S = L``. An unstable verdict at ``S = L`` extends
to every larger ``S`` (more staleness has not been seen to help); a good one to the smaller ``S`` down to the
next measurement. Between measurements nothing is claimed: the verdict there is ``unmeasured``.

Pure data and one lookup: no Django, no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal, get_args

from .jobs import LossConfig

Verdict = Literal["good", "slow", "unstable"]

CORRECTIONS: tuple[str, ...] = get_args(LossConfig.model_fields["off_policy"].annotation)
SEE = 'docs/learner.md, "Staleness and corrections, measured"'
SYNCHRONOUS = "249 ± 33 updates to reward 0.8 with no lag"  # the reference the rows' percentages are against

# The measurements behind the rows. Issue 32's: make demo's arithmetic job trained in-process, lags uniform 0..L,
# 4 seeds, updates until the 10-update mean reward reaches 0.8. Issue 17's: bench/bench_staleness.py --full --steps
# 500, 8 seeds (docs/learner.md, "Learning quality under staleness").
ISSUE_32 = "issue 32's measurement, 4 seeds"
ISSUE_17 = "issue 17's sweep, 8 seeds"


@dataclass(frozen=True)
class Evidence:
    """One measured region: ``correction`` over budgets ``s_min..s_max`` (``None``: no upper end)."""

    correction: str
    s_min: int
    s_max: int | None
    verdict: Verdict
    figure: str  # what was measured, for a person: updates to the target against synchronous, runs that got there
    source: str  # which measurement

    def covers(self, staleness: int) -> bool:
        return self.s_min <= staleness and (self.s_max is None or staleness <= self.s_max)


EVIDENCE: tuple[Evidence, ...] = (
    Evidence("behaviour", 2, 10, "good", "lags 0..10: 295 ± 66 updates to 0.8, +18% against synchronous, 4/4 "
             "runs reached it", ISSUE_32),
    Evidence("tis", 2, 2, "good", "lags 0..2: 277 ± 23 updates to 0.8, +11% against synchronous", ISSUE_32),
    Evidence("tis", 10, None, "unstable", "lags 0..10: 506 ± 167 updates to 0.8, +103% against synchronous; only "
             "2/4 runs reached it within 500", ISSUE_32),
    Evidence("none", 6, 9, "unstable", "S = 6: 0/8 runs reached 0.8 in 500 updates (final reward 0.30 ± 0.10)",
             ISSUE_17),
    Evidence("none", 10, None, "unstable", "lags 0..10: no run reached 0.8 (the reward peaked at 0.55)", ISSUE_32),
)


def _check(rows: tuple[Evidence, ...]) -> None:
    """Every row names a correction a job can choose and a sane range, and no two rows of a correction overlap."""
    for row in rows:
        if row.correction not in CORRECTIONS:
            raise ValueError(f"staleness evidence: unknown correction {row.correction!r}; known: "
                             f"{', '.join(CORRECTIONS)}")
        if row.s_min < 2 or (row.s_max is not None and row.s_max < row.s_min):
            raise ValueError(f"staleness evidence: bad range S = {row.s_min}..{row.s_max} for {row.correction}")
        for other in rows:
            if other is not row and other.correction == row.correction and (
                    other.covers(row.s_min) or (row.s_max is not None and other.covers(row.s_max))):
                raise ValueError(f"staleness evidence: two rows for {row.correction} cover S = "
                                 f"{max(row.s_min, other.s_min)}")


_check(EVIDENCE)


def evidence_for(staleness: int, correction: str, rows: tuple[Evidence, ...] = EVIDENCE) -> Evidence | None:
    """The row measured for this ``S`` and correction; None where nothing was."""
    if correction not in CORRECTIONS:
        raise ValueError(f"unknown off-policy correction {correction!r}; known: {', '.join(CORRECTIONS)}")
    return next((row for row in rows if row.correction == correction and row.covers(staleness)), None)


def guidance(*, staleness: int, correction: str, rows: tuple[Evidence, ...] = EVIDENCE) -> dict:
    """What the plan says about (``S``, ``correction``): the verdict, the measured figure and its source, the
    corrections measured good at this ``S``, and a warning (a sentence) where the region was found unstable."""
    row = evidence_for(staleness, correction, rows)
    better = [c for c in CORRECTIONS if c != correction and (e := evidence_for(staleness, c, rows)) is not None
              and e.verdict == "good"]
    warning = None
    if row is not None and row.verdict == "unstable":
        instead = f"Measured good at this S: off_policy = {' or '.join(better)}." if better else \
            "Choose a smaller S."
        warning = (f"S = {staleness} with off_policy = {correction} is in a region measured unstable: {row.figure} "
                   f"({row.source}). {instead} See {SEE}.")
    return {"staleness": staleness, "correction": correction, "verdict": row.verdict if row else "unmeasured",
            "figure": row.figure if row else None, "source": row.source if row else None, "better": better,
            "synchronous": SYNCHRONOUS, "see": SEE, "warning": warning}

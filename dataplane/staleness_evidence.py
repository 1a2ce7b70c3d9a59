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
SYNCHRONOUS = "238 [218, 294] updates to reward 0.8 with no lag (median [95%], 15/16 runs reached it)"

# The measurement behind the rows: bench/bench_staleness.py --full, make demo's arithmetic job trained
# in-process, lags uniform 0..S, updates until the 10-update mean reward reaches 0.8 (cap 400), paired by seed with
# percentile-bootstrap 95% intervals; 16 seeds in every cell (bench/data/staleness-2026-12-04.jsonl).
SWEEP = "bench_staleness --full, 2026-12-04"


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
    Evidence("behaviour", 2, 6, "good", "S = 6: 262 [237, 284] updates to 0.8, +10% [-9%, +23%] against "
             "synchronous, 15/16 runs reached it (S = 2: +4%, S = 3: +7%)", SWEEP),
    Evidence("behaviour", 7, None, "slow", "S = 11: 298 [264, 337] updates to 0.8, +25% [+2%, +46%] against "
             "synchronous, 14/16 runs reached it", SWEEP),
    Evidence("tis", 2, 3, "slow", "S = 2: 326 [297, 368] updates to 0.8, +37% [+10%, +60%] against synchronous, "
             "12/16 runs reached it (S = 3: +58%, 9/16)", SWEEP),
    Evidence("tis", 4, None, "unstable", "S = 6: only 5/16 runs reached 0.8 within 400 updates (final reward 0.62 "
             "against 0.82 with behaviour)", SWEEP),
    Evidence("mis", 2, 3, "slow", "S = 2: 324 [296, 398] updates to 0.8, +36% [+11%, +67%] against synchronous, "
             "12/16 runs reached it (S = 3: +41%, 10/16)", SWEEP),
    Evidence("mis", 4, None, "unstable", "S = 6: only 4/16 runs reached 0.8 within 400 updates (final reward 0.63 "
             "against 0.82 with behaviour)", SWEEP),
    Evidence("decoupled", 2, 3, "slow", "S = 3: 334 [273, 372] updates to 0.8, +40% [+3%, +59%] against "
             "synchronous, 13/16 runs reached it (S = 2: +64%, 9/16)", SWEEP),
    Evidence("decoupled", 4, None, "unstable", "S = 6: only 2/16 runs reached 0.8 within 400 updates (final reward "
             "0.60 against 0.82 with behaviour)", SWEEP),
    Evidence("none", 2, None, "unstable", "S = 2: only 6/16 runs reached 0.8 within 400 updates; S = 6: 0/16 "
             "(final reward 0.46 against 0.82 with behaviour)", SWEEP),
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
    corrections measured good at this ``S`` (``better``), and a warning (a sentence) where the region was found
    unstable, naming what did better there (good, else slower but stable)."""
    row = evidence_for(staleness, correction, rows)
    verdicts = {c: e.verdict for c in CORRECTIONS if c != correction and (e := evidence_for(staleness, c, rows))}
    better = [c for c, verdict in verdicts.items() if verdict == "good"]
    stable = [c for c, verdict in verdicts.items() if verdict == "slow"]
    warning = None
    if row is not None and row.verdict == "unstable":
        if better:
            instead = f"Measured good at this S: off_policy = {' or '.join(better)}."
        elif stable:
            instead = f"Measured slower but stable at this S: off_policy = {' or '.join(stable)}; or a smaller S."
        else:
            instead = "Choose a smaller S."
        warning = (f"S = {staleness} with off_policy = {correction} is in a region measured unstable: {row.figure} "
                   f"({row.source}). {instead} See {SEE}.")
    return {"staleness": staleness, "correction": correction, "verdict": row.verdict if row else "unmeasured",
            "figure": row.figure if row else None, "source": row.source if row else None, "better": better,
            "synchronous": SYNCHRONOUS, "see": SEE, "warning": warning}

"""The sweep's table (rich and markdown), its figure, and the answer (does staleness cost learning?), from runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from .grid import DEFAULT_CORRECTION, SYNCHRONOUS
from .stats import RESAMPLES, CellSummary, paired_ratio, summarise_cell

GOAL_RATIO, GOAL_INTERVAL = 0.10, 0.15  # S = 6 within 10% of synchronous, its 95% interval inside +-15%
QUESTION_BUDGET = 6


@dataclass(frozen=True)
class Row:
    task: str
    staleness: int
    correction: str
    cell: CellSummary
    ratio: tuple[float, float, float, int] | None  # median updates to target against synchronous, paired by seed


def rows(results: list[dict], *, resamples: int = RESAMPLES) -> list[Row]:
    """One row per (task, S, correction) that has runs, in the sweep's order."""
    out = []
    cells = sorted({(r["task"], r["staleness"], r["correction"]) for r in results},
                   key=lambda k: (k[0], k[1], k[2] != DEFAULT_CORRECTION, k[2]))
    for task, s, correction in cells:
        runs = [r for r in results if (r["task"], r["staleness"], r["correction"]) == (task, s, correction)]
        reference = {r["seed"]: _time(r) for r in results
                     if (r["task"], r["staleness"]) == (task, SYNCHRONOUS)}
        ratio = None
        if s != SYNCHRONOUS and reference.keys() & {r["seed"] for r in runs}:
            ratio = paired_ratio({r["seed"]: _time(r) for r in runs}, reference, resamples=resamples)
        out.append(Row(task, s, correction, summarise_cell(runs, resamples=resamples), ratio))
    return out


def _time(run: dict) -> float:
    return float(run["reached"] if run["reached"] is not None else run["steps"])


def _updates(c: CellSummary) -> str:
    median = f">= {c.cap}" if c.median_censored else f"{c.median:.0f}"
    return f"{median} [{c.median_ci[0]:.0f}, {c.median_ci[1]:.0f}]"


def _ratio(row: Row) -> str:
    """The ratio to synchronous as a change, '>=' when the cell's median is itself only a bound."""
    if row.ratio is None:
        return "-"
    value, low, high, _ = row.ratio
    bound = ">= " if row.cell.median_censored else ""
    return f"{bound}{100 * (value - 1):+.0f}% [{100 * (low - 1):+.0f}, {100 * (high - 1):+.0f}]"


COLUMNS = ("task", "S", "correction", "mean lag", "seeds", "reached", "updates to target, median [95%]",
           "mean (misses at cap) [95%]", "vs synchronous, paired [95%]", "final reward [95%]")


def cells(row: Row) -> list[str]:
    c = row.cell
    return [row.task, "sync" if row.staleness == SYNCHRONOUS else str(row.staleness), row.correction,
            f"{c.mean_lag:.2f}", str(c.seeds), f"{c.reached}/{c.seeds}", _updates(c),
            f"{c.mean:.0f} [{c.mean_ci[0]:.0f}, {c.mean_ci[1]:.0f}]", _ratio(row),
            f"{c.final:.3f} [{c.final_ci[0]:.3f}, {c.final_ci[1]:.3f}]"]


def print_table(console: Console, table_rows: list[Row], title: str) -> None:
    table = Table(title=title)
    for name in COLUMNS:
        table.add_column(name, justify="left" if name in ("task", "correction") else "right")
    for row in table_rows:
        table.add_row(*cells(row))
    console.print(table)


def markdown(table_rows: list[Row]) -> str:
    lines = ["| " + " | ".join(COLUMNS) + " |",
             "| " + " | ".join("---" if n in ("task", "correction") else "---:" for n in COLUMNS) + " |"]
    lines += ["| " + " | ".join(cells(row)) + " |" for row in table_rows]
    return "\n".join(lines) + "\n"


def goal(ratio: tuple[float, float, float, int], *, misses: int) -> str:
    """The project's goal for a ratio to synchronous (value, low, high, pairs): ``met`` when the value is within
    GOAL_RATIO of 1 and the whole interval inside 1 +- GOAL_INTERVAL; ``not met`` otherwise; ``undetermined`` when it
    would be met but some runs of either cell missed the target (a miss counts at the cap, so the interval is
    then only a lower bound on the upper side)."""
    value, low, high, _ = ratio
    inside = abs(value - 1) <= GOAL_RATIO and low >= 1 - GOAL_INTERVAL and high <= 1 + GOAL_INTERVAL
    if not inside:
        return "not met"
    return "met" if misses == 0 else "undetermined"


def verdict(table_rows: list[Row]) -> list[str]:
    """Issue 32's question, per task: is S = 6 within 10% of synchronous (median updates to target, paired) with its
    95% interval inside +-15% under the default correction, and which correction came closest (most runs reaching
    the target first, then the ratio nearest 1)."""
    out = []
    for task in sorted({r.task for r in table_rows}):
        at6 = [r for r in table_rows if r.task == task and r.staleness == QUESTION_BUDGET and r.ratio is not None]
        sync = next((r for r in table_rows if r.task == task and r.staleness == SYNCHRONOUS), None)
        if not at6 or sync is None:
            out.append(f"{task}: no S = {QUESTION_BUDGET} cell paired with synchronous yet")
            continue
        sync_misses = sync.cell.seeds - sync.cell.reached
        for row in at6:
            if row.correction == DEFAULT_CORRECTION:
                misses = row.cell.seeds - row.cell.reached + sync_misses
                out.append(f"{task}: S = 6 with {DEFAULT_CORRECTION} (the default): {_ratio(row)} against synchronous "
                           f"over {row.ratio[3]} paired seeds, {row.cell.reached}/{row.cell.seeds} reached "
                           f"(synchronous {sync.cell.reached}/{sync.cell.seeds}); goal (within {GOAL_RATIO:.0%}, "
                           f"interval inside +-{GOAL_INTERVAL:.0%}): {goal(row.ratio, misses=misses)}")
        best = min(at6, key=lambda r: (-r.cell.fraction_reached, abs(r.ratio[0] - 1), r.ratio[2] - r.ratio[1]))
        out.append(f"{task}: closest to synchronous at S = 6: {best.correction} ({_ratio(best)}, "
                   f"{best.cell.reached}/{best.cell.seeds} reached, final {best.cell.final:.3f})")
    return out


def save_figure(path: Path, table_rows: list[Row]) -> bool:
    """Per task: median updates to target against S with 95% intervals, and the final reward; one line per
    correction. False when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    tasks = sorted({r.task for r in table_rows})
    colours = {c: f"C{i}" for i, c in enumerate(sorted({r.correction for r in table_rows}))}  # the same in every panel
    fig, axes = plt.subplots(len(tasks), 2, figsize=(11, 3.8 * len(tasks)), squeeze=False)
    for (ax_t, ax_f), task in zip(axes, tasks, strict=True):
        mine = [r for r in table_rows if r.task == task]
        sync = next((r for r in mine if r.staleness == SYNCHRONOUS), None)
        budgets = sorted({r.staleness for r in mine if r.staleness != SYNCHRONOUS})
        corrections = sorted({r.correction for r in mine if r.staleness != SYNCHRONOUS})
        for i, correction in enumerate(corrections):
            line = [r for r in mine if r.correction == correction and r.staleness != SYNCHRONOUS]
            # one slot per budget, the corrections side by side in it
            x = [budgets.index(r.staleness) + 0.6 * (i + 0.5) / len(corrections) - 0.3 for r in line]
            for ax, key in ((ax_t, "median"), (ax_f, "final")):
                y = [getattr(r.cell, key) for r in line]
                ci = [getattr(r.cell, f"{key}_ci") for r in line]
                ax.errorbar(x, y, yerr=[[v - lo for v, (lo, _) in zip(y, ci, strict=True)],
                                        [hi - v for v, (_, hi) in zip(y, ci, strict=True)]],
                            marker="o", capsize=3, label=correction, color=colours[correction])
        for ax, key, label in ((ax_t, "median", "updates to target (median, misses at cap)"),
                               (ax_f, "final", "final-policy reward (mean)")):
            if sync is not None:
                value, (lo, hi) = getattr(sync.cell, key), getattr(sync.cell, f"{key}_ci")
                ax.axhline(value, color="black", lw=1, label=f"synchronous ({sync.cell.seeds} seeds)")
                ax.axhspan(lo, hi, color="black", alpha=0.08)
            ax.set_xticks(range(len(budgets)), [f"S = {b}" for b in budgets])
            ax.set_xlim(-0.5, len(budgets) - 0.5)
            ax.set_xlabel("staleness budget")
            ax.set_ylabel(label)
            ax.set_title(f"{task}: {label.split(' (')[0]}, 95% bootstrap")
            ax.grid(alpha=0.3)
        if mine:
            ax_t.axhline(mine[0].cell.cap, color="grey", lw=0.8, ls=":", label="step cap (a miss counts here)")
    legend = {}  # one legend under the panels, every label once (the synchronous line's seed counts per task)
    for ax in axes[:, 0]:
        legend.update(zip(*reversed(ax.get_legend_handles_labels()), strict=True))
    fig.legend(list(legend.values()), list(legend), loc="lower center", ncol=4, fontsize=8)
    fig.tight_layout(rect=(0, 0.06 + 0.04 / len(tasks), 1, 1))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return True

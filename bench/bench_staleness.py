"""Learning under staleness, measured with statistics: GRPO through the learner's own update, fed by a
simulated pool whose records lag by up to S versions, against the synchronous reference, per off-policy correction,
over seeds, with bootstrap 95% intervals.

Run: ``.venv/bin/python bench/bench_staleness.py --full [--jobs 2] [--results var/staleness/results.jsonl]`` for the
whole sweep: arithmetic (``make demo``'s job) and arithmetic9 (operands 0..9, + and *, hidden 128), the
synchronous reference and S in {2, 3, 6, 11}, every correction the learner implements, 16 seeds. Every finished run
is appended to ``--results`` as one JSON line; rerunning skips the runs already there, so the sweep resumes where it
stopped (``--stop-at HH:MM`` starts no run after that UTC time). Without ``--full`` (what ``make bench`` runs):
arithmetic, synchronous and S = 6 with the default correction, 2 seeds, 100 updates, into a fresh temporary file: a
minute or two. ``--tasks``, ``--staleness``, ``--corrections``, ``--seeds``, ``--steps`` override either;
``--report-only`` prints the table and draws the figure from the results file without running anything.

Per run (bench/staleness/runs.py): updates until the 10-update mean batch reward reaches the task's target (censored
at the step cap), the final policy's reward. Per cell (bench/staleness/stats.py): median and mean updates to target
(a miss counted at the cap) with bootstrap 95% intervals over seeds, the fraction reaching the target, the ratio
to synchronous paired by seed, the final reward's mean with its interval. The table, the figure and the answer to
the issue's question (bench/staleness/report.py) come from what finished.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.staleness.grid import (  # noqa: E402
    DEFAULT_CORRECTION,
    SYNCHRONOUS,
    append_result,
    corrections_available,
    grid,
    load_results,
    run_key,
)
from bench.staleness.report import markdown, print_table, rows, save_figure, verdict  # noqa: E402
from bench.staleness.runs import SETUPS, run  # noqa: E402

RUN_TIMEOUT_S = 3 * 3600  # one run far past this is stuck, not slow
FULL_SEEDS, QUICK_SEEDS, QUICK_STEPS = 16, 2, 100
FULL_TASKS = ["arithmetic", "arithmetic9"]  # countdown only when asked (--tasks): see SETUPS in runs.py


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--full", action="store_true", help=f"the whole sweep: both tasks, S in sync/2/3/6/11, every "
                        f"correction, {FULL_SEEDS} seeds, each task's step cap")
    parser.add_argument("--tasks", nargs="+", choices=sorted(SETUPS), help="tasks (default: arithmetic; --full "
                        f"{' and '.join(FULL_TASKS)})")
    parser.add_argument("--staleness", type=int, nargs="+", help="budgets S: 0 is the synchronous reference, "
                        "else >= 2 (default: 0 6; --full 0 2 3 6 11)")
    parser.add_argument("--corrections", nargs="+", help=f"off_policy values (available: "
                        f"{', '.join(corrections_available())}; default: {DEFAULT_CORRECTION}; --full all)")
    parser.add_argument("--seeds", type=int, help=f"seeds per cell, 1..N (default {QUICK_SEEDS}; --full {FULL_SEEDS})")
    parser.add_argument("--steps", type=int, help=f"step cap of every run (default {QUICK_STEPS}; --full the task's)")
    parser.add_argument("--jobs", type=int, default=2, help="runs in parallel processes, one CPU thread each")
    parser.add_argument("--results", type=Path, help="JSON-lines file of finished runs, appended to and resumed from "
                        "(default: var/staleness/results.jsonl with --full, else a fresh temporary file)")
    parser.add_argument("--stop-at", help="UTC time HH:MM after which no new run starts (running ones finish)")
    parser.add_argument("--report-only", action="store_true", help="no runs: the table and figure from --results")
    parser.add_argument("--png", type=Path, default=Path("var/bench/staleness.png"), help="the figure")
    parser.add_argument("--markdown", type=Path, help="also write the table as markdown here")
    args = parser.parse_args()
    args.tasks = args.tasks or (FULL_TASKS if args.full else ["arithmetic"])
    args.staleness = args.staleness or ([SYNCHRONOUS, 2, 3, 6, 11] if args.full else [SYNCHRONOUS, 6])
    args.corrections = args.corrections or (corrections_available() if args.full else [DEFAULT_CORRECTION])
    args.seeds = args.seeds or (FULL_SEEDS if args.full else QUICK_SEEDS)
    if args.seeds < 1 or args.jobs < 1 or (args.steps is not None and args.steps < 10):
        parser.error("--seeds and --jobs must be >= 1, --steps >= 10 (the reward window)")
    if args.stop_at:
        try:
            hour, minute = (int(x) for x in args.stop_at.split(":"))
            now = dt.datetime.now(dt.UTC)
            args.stop_at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
            if args.stop_at <= now:  # the next time the clock shows HH:MM
                args.stop_at += dt.timedelta(days=1)
        except ValueError:
            parser.error(f"--stop-at: give a UTC time as HH:MM, got {args.stop_at!r}")
    return args


def main() -> None:
    args = parse_args()
    console = Console() if sys.stdout.isatty() else Console(width=200)  # a log file gets the whole table
    with tempfile.TemporaryDirectory(prefix="staleness-results-") as tmp:
        results_path = args.results or (Path("var/staleness/results.jsonl") if args.full else Path(tmp) / "r.jsonl")
        steps = {t: args.steps or (SETUPS[t].steps if args.full else QUICK_STEPS) for t in args.tasks}
        try:
            planned = grid(args.tasks, args.staleness, args.corrections, list(range(1, args.seeds + 1)), steps)
        except ValueError as e:
            console.print(f"[red]error: {e}[/red]")
            raise SystemExit(2) from None
        finished, skipped = load_results(results_path)
        if skipped:
            console.print(f"[yellow]{skipped} line(s) of {results_path} skipped: unreadable or of another "
                          "setup[/yellow]")
        if not args.report_only:
            finished += sweep(console, planned, finished, results_path, args)
        wanted = {run_key(r) for r in planned}
        report(console, [r for r in finished if run_key(r) in wanted], planned, args)


def sweep(console: Console, planned: list[dict], finished: list[dict], path: Path, args) -> list[dict]:
    """Run what ``planned`` holds and ``finished`` does not, ``args.jobs`` at a time, in the plan's order; each
    result appended to ``path`` as it comes. Progress: runs done of the total, elapsed, ETA."""
    done_keys = {run_key(r) for r in finished}
    todo = [r for r in planned if run_key(r) not in done_keys]
    console.print(f"[dim]{len(planned)} runs planned, {len(planned) - len(todo)} already in {path}, {len(todo)} to "
                  f"run, {args.jobs} at a time[/dim]")
    new: list[dict] = []
    started = time.monotonic()
    running: dict[Future, dict] = {}
    with ProcessPoolExecutor(max_workers=args.jobs) as pool:
        while todo or running:
            while todo and len(running) < args.jobs and not _past(args.stop_at):
                spec = todo.pop(0)
                running[pool.submit(run, SETUPS[spec["task"]], staleness=spec["staleness"],
                                    correction=spec["correction"], seed=spec["seed"], steps=spec["steps"])] = spec
            if not running:
                console.print(f"[yellow]--stop-at {args.stop_at:%H:%M} passed: {len(todo)} runs left for the next "
                              "invocation[/yellow]")
                break
            done, _ = wait(running, timeout=RUN_TIMEOUT_S, return_when=FIRST_COMPLETED)
            if not done:
                raise TimeoutError(f"no run finished in {RUN_TIMEOUT_S} s: {list(running.values())}")
            for future in done:
                running.pop(future)
                result = future.result()
                append_result(path, result)
                new.append(result)
                elapsed = time.monotonic() - started
                left = len(todo) + len(running)
                eta = elapsed / len(new) * left
                console.print(f"[dim]{len(planned) - left}/{len(planned)} {result['task']} "
                              f"S={result['staleness']} {result['correction']} seed {result['seed']}: target at "
                              f"{result['reached'] or '-'}, final {result['final']:.3f} ({result['seconds']:.0f} s); "
                              f"elapsed {elapsed / 60:.1f} min, ETA {eta / 60:.1f} min[/dim]")
    return new


def _past(stop_at: dt.datetime | None) -> bool:
    return stop_at is not None and dt.datetime.now(dt.UTC) >= stop_at


def report(console: Console, results: list[dict], planned: list[dict], args) -> None:
    if not results:
        console.print("[yellow]no finished runs to report[/yellow]")
        return
    table_rows = rows(results)
    caps = ", ".join(f"{t} {SETUPS[t].target} within {s}" for t, s in
                     sorted({(r["task"], r["steps"]) for r in results}))
    print_table(console, table_rows, f"GRPO under staleness ({len(results)} of {len(planned)} planned runs): updates "
                f"until the 10-update mean batch reward reaches the target ({caps}); bootstrap 95% over seeds")
    console.print("[dim]A run that missed the target counts at the cap: a mean with misses is a lower bound, and a "
                  "median of a cell where half or more missed shows as '>= cap'. 'vs synchronous': the ratio of "
                  "median updates to the synchronous cell's, seeds resampled jointly (a seed fixes init and "
                  "prompts).[/dim]")
    for line in verdict(table_rows):
        console.print(line)
    if args.markdown:
        args.markdown.parent.mkdir(parents=True, exist_ok=True)
        args.markdown.write_text(markdown(table_rows))
        console.print(f"markdown table: {args.markdown}")
    if save_figure(args.png, table_rows):
        console.print(f"figure: {args.png}")
    else:
        console.print("[yellow]matplotlib is not installed in this environment: no figure (pip install "
                      "matplotlib)[/yellow]")


if __name__ == "__main__":
    main()

"""Fleet bench: N emulated agents against the real site, with 1 or more site processes.

Run: ``.venv/bin/python bench/bench_fleet.py [--agents 100,300] [--site-processes 1,2] [--database postgres]
[--window 30] [--tokens-per-s 256] [--no-drain] [--json PATH]``. N = 1000 is opt-in (``--agents 100,300,1000``):
its row adds 2-3 minutes on a 2-core machine, and the emulated fleet's own CPU (1,000 websocket clients in Python)
competes with the site it measures (the table shows both).

Starts, on loopback: a private redis-server, a fresh PostgreSQL database (dropped at the end; ``--database
sqlite``: a file), Celery worker and beat, and per row fresh daphne processes, a job and its real
``echo2-learner`` (the tiny model of ``echo2-learner init-model``; it publishes snapshot version 0, the base).
The agents are the real ``AgentSession`` and protocol code with a stand-in engine (``bench/fleet/engine.py``: no
model; it sleeps ``tokens / --tokens-per-s``), ``--agent-processes`` processes of many sessions on one event loop
each, spread over the site processes by port. Each agent's cache holds the base already (a provider that served
this model before); it still installs version 0 through the session (digest checked, engine built).

Each row: connect N agents; ``--idle`` s of heartbeats alone; create and start a job through the last site
process (so with two, every push crosses processes for half the fleet); wait until every agent installed the
base and the site accepted a first group; measure ``--window`` s of generation from 2 s later; time one re-plan;
cancel the job (release). Columns:

- connected: agents welcomed, and seconds until the last was; heartbeats on time: share of the heartbeats sent
  (idle / generating) that the site handled within 1 s (pairing each with the site's heartbeat record in Redis,
  ``marketplace.infra.telemetry``), and heartbeats handled on time per second while generating;
- groups/s, records/s: what the site accepted (the job's Redis counters) over the window;
- welcomes past one per agent: a site process that runs late announces a lower budget in a new ``welcome``
  (``marketplace/realtime/lag.py``; a reconnect is welcomed again too).
- refused: ``rejected`` replies the agents received in the row; lost: groups leased more than 60 s before the
  release (the longest reply timeout an agent can use: it derives its own from the round trips it measures,
  worker_agent/timing.py), never accepted, handed back, nor refused for their content, of how many were leased
  that early (with the default ``--window 30`` only the first leases are judged; ``--window 90`` judges a whole
  window's);
- lease / return p50 / p99: reply latency of lease requests and of group returns in the window;
- activate / release: seconds from the job's start (cancel) request to the last agent's assign (release);
  re-plan: one ``scheduling.job_replan`` of the running job (the bench process, against the live database);
  push: snapshot notices (every one carries the chain assignment) from the first agent told to the last;
- CPU ms/msg: the daphne processes' user+system CPU (``/proc``) over the window per agent message (heartbeats and
  requests) sent in it; DB xact/msg: PostgreSQL transactions of the whole site (daphne and Celery; the learner and
  agents use none) per message (``pg_stat_database`` xact_commit + xact_rollback; each autocommit query is one);
- bubble: the learner's ``wait`` / (``wait`` + ``t_train``) over its steps logged in the window.

``--drain`` (default): a bench-side consumer keeps prompts topped up for the whole fleet and acknowledges groups as
they come (``bench/fleet/drain.py``): the real learner tops up only 2 x (groups per step) prompts, so without it
ingest is bounded by the learner's training speed, not by the site. ``--no-drain`` measures that real loop.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

JOB = {"task": {"name": "arithmetic"}, "staleness": 3, "batch_trajectories": 128, "learning_rate": 1e-3,
       "max_steps": 1_000_000}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ints = lambda text: [int(x) for x in text.split(",") if x.strip()]  # noqa: E731
    parser.add_argument("--agents", type=ints, default=[100, 300], help="Fleet sizes, one row each (default "
                        "100,300, about 4 min on 2 cores; 1000 is opt-in: its row adds 2-3 min, and the emulated "
                        "fleet's own CPU competes with the site's).")
    parser.add_argument("--site-processes", type=ints, default=[1], help="daphne processes per row, e.g. 1,2 "
                        "(every fleet size is run with each).")
    parser.add_argument("--database", choices=("postgres", "sqlite"), default="postgres",
                        help="PostgreSQL on 127.0.0.1:5432 (a fresh database, dropped at the end) or SQLite.")
    parser.add_argument("--agent-processes", type=int, default=4, help="Processes the fleet runs in.")
    parser.add_argument("--tokens-per-s", type=float, default=256.0, help="Each stand-in GPU's generation speed.")
    parser.add_argument("--completion-tokens", type=int, default=16, help="Tokens per completion (max_new_tokens).")
    parser.add_argument("--group-size", type=int, default=8, help="Samples per prompt (n).")
    parser.add_argument("--groups-per-lease", type=int, default=2, help="The agent's --groups.")
    parser.add_argument("--idle", type=float, default=10.0, help="Seconds of heartbeats alone, before the job.")
    parser.add_argument("--window", type=float, default=30.0, help="Seconds of generation measured.")
    parser.add_argument("--drain", action=argparse.BooleanOptionalAction, default=True,
                        help="Acknowledge groups as they come (measure the site, not the learner).")
    parser.add_argument("--hog", action="store_true", help="Hold one core busy for the whole run (a spin loop the "
                        "bench starts and stops by its id): the fleet on a machine with a core taken.")
    parser.add_argument("--real-agents", type=int, default=0, help="Real `echo2-agent run` processes (the tiny "
                        "model on CPU) beside the emulated fleet in every row.")
    parser.add_argument("--job-steps", type=int, default=0, help="Rows run one job of this many steps to its end "
                        "with the real learner (no drain) and audit it (bench/fleet/jobrow.py: lost, trained twice, "
                        "resends, told accepted = stored) instead of measuring a window; 0: the window rows.")
    parser.add_argument("--job-batch", type=int, default=128, help="With --job-steps: trajectories per step (R); "
                        "a smaller R makes steps of a loaded site come sooner.")
    parser.add_argument("--job-timeout", type=float, default=240.0, help="With --job-steps: give up on a job after "
                        "this long without a step (each step gives half of it more, at most 4 x it in all).")
    parser.add_argument("--fault-rows", nargs="*", default=[], choices=("site-restart", "redis-restart"),
                        help="With --job-steps: one more job row per fault at the largest fleet and site-process "
                        "count, the fault once the learner passed a quarter of the steps (Redis then keeps an AOF).")
    parser.add_argument("--fault-rows-only", action="store_true", help="With --fault-rows: only the fault rows.")
    parser.add_argument("--workdir", type=Path, help="State and logs (wiped; default: a fresh var/bench-fleet/run-* "
                        "of its own, so two runs never share one).")
    parser.add_argument("--json", type=Path, help="Also write the rows as JSON here.")
    parser.add_argument("--markdown", type=Path, help="Also write the table as Markdown here.")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from rich.console import Console

    from echo2_site.demo import _raise_stopped

    console = Console(width=max(100, Console().width))
    run = time.strftime(f"run-%Y%m%d-%H%M%S-{os.getpid()}")
    workdir = (args.workdir or ROOT / "var" / "bench-fleet" / run).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, _raise_stopped)
    signal.signal(signal.SIGINT, signal.default_int_handler)  # Ctrl-C, even where the parent ignored it (a & job)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})

    from bench.fleet.rows import Row
    from bench.fleet.site import Site
    from bench.fleet.tables import table

    if args.fault_rows and not args.job_steps:
        console.print("[red]--fault-rows needs --job-steps (a job that runs to its end)")
        return 2
    if args.job_steps:
        return job_rows(args, workdir, console)
    site = Site(workdir, database=args.database)
    rows = []
    try:
        console.print(f"starting the stack ({args.database}, {max(args.agents)} workers registered) in {workdir}")
        site.start_base(workers=max(args.agents), real=args.real_agents)
        if args.hog:
            site.start_hog()
        for processes in args.site_processes:
            for n in args.agents:
                console.print(f"row: {n} agents, {processes} site process(es) ...")
                row = Row(site, args, n=n, processes=processes, tag=f"{n}x{processes}")
                rows.append(row)  # what it measured is shown even when it fails part way
                row.run()
                console.print(table([row]))
    except BaseException as err:  # Ctrl-C, the signal's Stopped, a stack that failed: stop everything, say why
        console.print("interrupted" if isinstance(err, KeyboardInterrupt) else f"[red]bench failed: {err!r}")
        if rows:
            console.print(table(rows, title="fleet bench: the rows so far (the last one stopped part way)"))
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):  # a second Ctrl-C must not cut the cleanup
            signal.signal(signum, signal.SIG_IGN)
        site.stop()
        console.print(f"every process stopped; logs in {site.stack.logs}")
    command = "bench/bench_fleet.py " + " ".join(sys.argv[1:] if argv is None else argv)
    Console(width=max(console.width, 44 + 34 * len(rows))).print(table(rows, title=f"fleet bench: {command}"))
    from bench.fleet.tables import first_limit

    console.print(first_limit(rows))
    if args.json:
        args.json.write_text(json.dumps([r.figures for r in rows], indent=1))
    if args.markdown:
        from bench.fleet.tables import markdown

        args.markdown.write_text(f"`{command}`\n\n" + markdown(rows) + f"\n{first_limit(rows)}\n")
    return 0


def job_rows(args: argparse.Namespace, workdir: Path, console) -> int:
    """--job-steps: each row one job to its end under the fleet (bench/fleet/jobrow.py), then the fault rows."""
    from bench.fleet.jobrow import JobRow, markdown, passes
    from bench.fleet.site import Site

    site, rows = Site(workdir, database=args.database, aof=True), []
    plan = [] if args.fault_rows_only else [(n, p, "") for p in args.site_processes for n in args.agents]
    plan += [(max(args.agents), max(args.site_processes), fault) for fault in args.fault_rows]
    try:
        console.print(f"starting the stack ({args.database}, {max(args.agents)} + {args.real_agents} workers) in "
                      f"{workdir}")
        site.start_base(workers=max(args.agents), real=args.real_agents)
        if args.hog:
            site.start_hog()
        for n, processes, fault in plan:
            tag = f"{n}x{processes}" + (f"-{fault}" if fault else "")
            console.print(f"job row: {n} agents (+{args.real_agents} real), {processes} site process(es), fault: "
                          f"{fault or 'none'} ...")
            row = JobRow(site, args, n=n, processes=processes, tag=tag, fault=fault)
            rows.append(row)
            row.run()
            console.print(markdown([row]))
    except BaseException as err:  # noqa: BLE001 - Ctrl-C or a broken stack: stop everything, show the rows so far
        console.print("interrupted" if isinstance(err, KeyboardInterrupt) else f"[red]bench failed: {err!r}")
        return 130 if isinstance(err, KeyboardInterrupt) else 1
    finally:
        for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(signum, signal.SIG_IGN)
        site.stop()
        command = "bench/bench_fleet.py " + " ".join(sys.argv[1:])
        if rows:  # what was measured, also when a row or the run stopped part way
            console.print(markdown(rows))
            if args.json:
                args.json.write_text(json.dumps([r.figures for r in rows], indent=1, default=str))
            if args.markdown:
                args.markdown.write_text(f"`{command}`\n\n" + markdown(rows))
        console.print(f"every process stopped; logs in {site.stack.logs}")
    console.print(f"{sum(not passes(r.figures) for r in rows)}/{len(rows)} job rows pass")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""``make demo``: the whole stack on this machine, training a tiny model until its reward rises.

Starts a private Redis (on a free port), migrates a fresh SQLite database, creates a job owner and
three providers with different prices, starts daphne, a Celery worker and beat, registers and runs
three agents through ``echo2-agent``, submits a job through the REST API, starts ``echo2-learner``
and shows the job's progress until it ends, then hands over: the dashboard and its logins, the owner's token file and
the next commands. In a terminal the site stays up until Ctrl-C (``--keep-running``/``--no-keep-running`` choose);
Ctrl-C, SIGTERM and SIGHUP stop every process it started.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from echo2_site.demo_handover import handover_lines, learner_argv, shown

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PROVIDERS = [("alice", "rtx-5090", 0.35), ("bob", "rtx-4090", 0.29), ("carol", "a10g", 0.75)]


DAPHNE_WEBSOCKET_LIMITS = ["--websocket-max-message-size", str(16 << 20), "--websocket-max-frame-size", str(16 << 20)]
"""daphne's own websocket limits (1 MiB by default, and it drops what exceeds them without a reason): twice the
site's ECHO2_WS_MAX_MESSAGE_BYTES (8 MiB), so frames between the two get the site's reason and close code."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Stack:
    """Processes started by the demo, each in its own process group, logs under ``logs/``."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.workdir, self.env = workdir, env
        self.logs = workdir / "logs"
        self.logs.mkdir(parents=True, exist_ok=True)
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, *argv: str) -> subprocess.Popen:
        _check_stopped()
        if not self.procs:
            stop_on_signals()
            atexit.register(self.stop)  # whatever way the program ends, nothing it started outlives it
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=ROOT, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, proc))
        pids = {n: p.pid for n, p in self.procs}
        (self.workdir / "pids.json").write_text(json.dumps(pids))  # what an operator (or a test) may check
        return proc

    def run(self, *argv: str) -> str:
        _check_stopped()
        done = subprocess.run(argv, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=300)
        _check_stopped()
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout

    def check_alive(self) -> None:
        _check_stopped()
        for name, proc in self.procs:
            if name != "learner" and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.logs / (name + '.log')}")

    def stop(self) -> None:
        for _, proc in reversed(self.procs):
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGTERM)
        for pid in _untracked_children({proc.pid for _, proc in self.procs}):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                try:
                    os.killpg(pid, signal.SIGKILL)  # started by start(): its own session, its group is its pid
                except ProcessLookupError:
                    os.kill(pid, signal.SIGKILL)  # a run()'s child, in our group
        deadline = time.monotonic() + 10
        for _, proc in self.procs:
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def _untracked_children(tracked: set[int]) -> list[int]:
    """Our live child processes that ``Stack.procs`` does not hold: a SIGTERM or SIGHUP raised inside ``Popen``
    after the fork (the handler raises at any bytecode) leaves a started child unrecorded, and ``make demo``'s
    signal test once found such a celery worker alive 38 minutes later. Read from /proc (Linux); elsewhere none."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        pid = int(stat.parent.name)
        if fields[0] != "Z" and int(fields[1]) == os.getpid() and pid not in tracked:
            found.append(pid)
    return found


class Stopped(BaseException):
    """SIGTERM or SIGHUP: stop everything the demo started, as Ctrl-C does. A BaseException, as KeyboardInterrupt
    is, so that no ``except Exception`` on the way swallows it."""


_STOP_SIGNALS: list[str] = []
"""Signals received. The handler raises at whatever bytecode the main thread is at; where that is a ``__del__`` or
a weakref callback, Python prints and drops the exception, so every loop and every step checks this list too."""


def _raise_stopped(signum, _frame) -> None:
    _STOP_SIGNALS.append(signal.Signals(signum).name)
    raise Stopped(_STOP_SIGNALS[0])


def stop_on_signals() -> None:
    """SIGTERM and SIGHUP raise :class:`Stopped` in the main thread, as Ctrl-C raises KeyboardInterrupt, so the
    ``finally`` that stops a :class:`Stack` runs (its children live in sessions of their own: no signal reaches
    them). A handler a program set itself is kept; off the main thread nothing can be set (the atexit stop remains).
    Before this a bench killed by ``timeout`` left its private redis-server and daphne running."""
    if threading.current_thread() is not threading.main_thread():
        return
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) in (signal.SIG_DFL, None):
            signal.signal(signum, _raise_stopped)
    # A blocked signal stays blocked across exec: a parent that blocked one would leave it pending here forever.
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM, signal.SIGHUP, signal.SIGINT})


def _check_stopped() -> None:
    if _STOP_SIGNALS:
        raise Stopped(_STOP_SIGNALS[0])


def wait_for(check, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _check_stopped()
        try:
            if check():
                return
        except (OSError, httpx.HTTPError):
            pass
        time.sleep(0.3)
    raise RuntimeError(f"timed out waiting for {what}")


def claim_workdir(workdir: Path):
    """The lock of ``workdir`` (an open file: keep it), or why it cannot be had: another demo runs there. Two runs in
    one directory destroyed each other (the second wiped the first's database; their Celery beats shared a schedule
    file) and neither said why. The lock sits beside the directory, which each run wipes."""
    path = workdir.parent / f".{workdir.name}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    held = open(path, "a+")  # noqa: SIM115 - held for the life of the process
    try:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        held.seek(0)
        owner = held.read().strip() or "unknown"
        held.close()
        return (f"another demo (pid {owner}) is running in {workdir}: stop it first (Ctrl-C in its terminal, or "
                f"kill {owner}), or give this one its own directory with --workdir")
    held.seek(0)
    held.truncate()
    held.write(f"{os.getpid()}\n")
    held.flush()
    return held


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "demo", help="State and logs (wiped).")
    parser.add_argument("--port", type=int, default=0, help="Site port (default: a free one).")
    parser.add_argument("--steps", type=int, default=1500, help="Learner steps at most.")
    parser.add_argument("--target", type=float, default=0.8, help="Complete once the 10-step mean reward reaches it.")
    parser.add_argument("--keep-running", action=argparse.BooleanOptionalAction, default=None,
                        help="Leave the site up after the job ends, until Ctrl-C (default: when run in a terminal).")
    args = parser.parse_args(argv)

    from rich.console import Console

    console = Console()
    workdir = args.workdir.resolve()

    def body(stack: Stack, server: str, site_port: int) -> int:
        tokens, model_dir = _start_site(console, stack, server, site_port, workdir)
        _start_agents(console, stack, server, tokens, workdir)
        api = httpx.Client(base_url=server + "/api/", headers={"Authorization": f"Token {tokens['demo']}"},
                           timeout=30)
        job = _launch_job(console, stack, api, server, tokens["demo"], model_dir, args, workdir)
        code = _watch(console, api, stack, job["id"], args.target, server)
        _hand_over(console, stack, server, job["id"], workdir, args.keep_running)
        return code

    return run_stack(console, workdir=workdir, port=args.port, env={"ECHO2_WORKER_TIMEOUT_S": "20"},
                     title="ECHO-2 demo", make_target="demo", body=body)


def run_stack(console, *, workdir: Path, port: int, env: dict[str, str], title: str, make_target: str,
              body: Callable[[Stack, str, int], int]) -> int:
    """The frame every demo runs in: the work directory claimed (one demo per directory) and wiped, a private
    Redis, every process stopped at the end whatever ends it. ``body(stack, server, site_port)`` starts the site,
    the agents and the job and returns the exit code; ``env`` is added to the stack's environment."""
    claim = claim_workdir(workdir)  # held until this function returns (closing the file releases the lock)
    if isinstance(claim, str):
        console.print(f"[red]{claim}")
        return 1
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    redis_port, site_port = free_port(), port or free_port()
    server = f"http://127.0.0.1:{site_port}"
    stack = Stack(workdir, {
        **os.environ, "DATABASE_URL": f"sqlite:///{workdir / 'echo2.sqlite3'}",
        "REDIS_URL": f"redis://127.0.0.1:{redis_port}/0", "ECHO2_DATA_DIR": str(workdir), "DEBUG": "true",
        "DJANGO_SETTINGS_MODULE": "echo2_site.settings", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
        "TOKENIZERS_PARALLELISM": "false", "PYTHONUNBUFFERED": "1", **env})
    stop_on_signals()  # each child runs in its own session: they get no signal
    redis_server = shutil.which("redis-server")
    if redis_server is None:
        console.print(f"[red]redis-server is not installed; `make {make_target}` installs it "
                      "(apt-get install redis-server)")
        return 1
    try:
        console.rule(title)
        stack.start("redis", redis_server, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                    "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(workdir))
        console.print(f"private Redis on 127.0.0.1:{redis_port}")
        return body(stack, server, site_port)
    except KeyboardInterrupt:
        console.print("\ninterrupted")
        return 130
    except Stopped as sig:
        console.print(f"\n{sig}: stopping")
        return 128 + signal.Signals[str(sig)].value
    except RuntimeError as err:
        console.print(f"[red]demo failed: {err}")
        return 1
    finally:
        stack.stop()
        console.print(f"all demo processes stopped; logs in {stack.logs}")
        claim.close()


def _hand_over(console, stack: Stack, server: str, job_id: int, workdir: Path, keep_running: bool | None,
               make_target: str = "demo") -> None:
    """Print what the newcomer needs next; then, kept running (the default in a terminal), wait for Ctrl-C."""
    keep_running = keep_running if keep_running is not None else _interactive()
    console.rule("hand-over")
    for line in handover_lines(server=server, job_id=job_id, workdir=workdir, bin_dir=BIN,
                               providers=[p[0] for p in PROVIDERS], keep_running=keep_running,
                               make_target=make_target):
        console.print(line, markup=False, highlight=False, soft_wrap=True)
    while keep_running:
        stack.check_alive()
        time.sleep(1)


def _interactive() -> bool:
    """A person at a terminal (stdin and stdout both ttys): keep the dashboard up for them; CI and pipes end."""
    return sys.stdin.isatty() and sys.stdout.isatty()


def _start_site(console, stack: Stack, server: str, site_port: int, workdir: Path,
                build_model=None) -> tuple[dict[str, str], Path]:
    """Migrate, create the users, build the model (``build_model(console, stack, workdir) -> dir``; default the tiny
    one), start daphne and Celery; returns (tokens, model dir)."""
    py = str(BIN / "python")
    stack.run(py, "manage.py", "migrate", "--noinput")
    tokens = _create_users(stack, py)
    model_dir = (build_model or _tiny_model)(console, stack, workdir)
    stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(site_port), *DAPHNE_WEBSOCKET_LIMITS,
                "echo2_site.asgi:application")
    stack.start("celery-worker", str(BIN / "celery"), "-A", "echo2_site", "worker", "-l", "info", "-P", "solo")
    stack.start("celery-beat", str(BIN / "celery"), "-A", "echo2_site", "beat", "-l", "info",
                "-s", str(workdir / "celerybeat-schedule"))
    wait_for(lambda: httpx.get(server + "/api/schema/", timeout=2).status_code == 200, "the site", 60)
    console.print(f"site up at {server}  (dashboard login: demo / demo)")
    return tokens, model_dir


def _tiny_model(console, stack: Stack, workdir: Path) -> Path:
    model_dir = workdir / "tiny-arithmetic"
    stack.run(str(BIN / "echo2-learner"), "init-model", str(model_dir), "--task", "arithmetic")
    console.print(f"tiny model built in {model_dir}")
    return model_dir


def _start_agents(console, stack: Stack, server: str, tokens: dict[str, str], workdir: Path) -> None:
    """Register and run one agent per provider, each relaying snapshot chunks to its chain peer. Agents get the job's
    model from the learner (snapshot version 0) into their own cache: they are never told where it lives."""
    for user, gpu, price in PROVIDERS:
        cfg = workdir / "agents" / f"{user}.json"
        relay = f"127.0.0.1:{free_port()}"  # chain peers pull snapshot chunks from here
        stack.run(str(BIN / "echo2-agent"), "register", "--server", server, "--token-file", _token_file(workdir, user,
                                                                                                       tokens[user]),
                  "--name", f"{user}-{gpu}", "--gpu", gpu, "--price", str(price), "--config", str(cfg),
                  "--bandwidth-mbps", "100", "--relay-address", relay)
        stack.start(f"agent-{user}", str(BIN / "echo2-agent"), "run", "--config", str(cfg), "--threads", "1",
                    "--relay-listen", relay, "--cache-dir", str(workdir / "agents" / f"{user}-cache"))
        console.print(f"agent {user}-{gpu} registered at ${price}/h and running (relay {relay})")


def _launch_job(console, stack: Stack, api: httpx.Client, server: str, token: str, model_dir: Path, args,
                workdir: Path) -> dict:
    """Create and start the demo job, then its learner with the command an owner runs (no Redis URL: the site hands
    it a Redis user of the job's own); returns the job."""
    job = api.post("jobs/", json={
        "name": "demo: arithmetic from scratch", "model_dir": str(model_dir),
        "task": {"name": "arithmetic", "max_operand": 4}, "staleness": 3, "batch_trajectories": 128,
        "group_size": 8, "learning_rate": 1e-3, "max_steps": args.steps, "max_new_tokens": 2,
        "target_reward": args.target,
    }).raise_for_status().json()
    api.post(f"jobs/{job['id']}/start/").raise_for_status()
    _token_file(workdir, "demo", token)
    stack.start("learner", *learner_argv(server=server, job_id=job["id"], workdir=workdir, bin_dir=BIN))
    console.print(f"job {job['id']} started; dashboard: {server}/jobs/{job['id']}/; TensorBoard: "
                  f"{shown(BIN / 'tensorboard')} --logdir {shown(workdir / 'runs')}")  # the venv's, as elsewhere
    return job


def _token_file(workdir: Path, user: str, token: str) -> str:
    """The user's API token in a file only its owner reads (a token on a command line shows in ``ps``)."""
    path = workdir / "tokens" / user
    path.parent.mkdir(exist_ok=True)
    path.touch(mode=0o600)
    path.write_text(token + "\n")
    return str(path)


def _create_users(stack: Stack, py: str) -> dict[str, str]:
    script = (
        "from django.contrib.auth.models import User\n"
        "from marketplace.services import api_token_issue\n"
        "import json\n"
        "out = {}\n"
        f"for name in ['demo'] + {[p[0] for p in PROVIDERS]!r}:\n"
        "    user = User.objects.create_user(name, password=name, is_staff=(name == 'demo'))\n"
        "    if user.is_staff:  # staff read every model in /admin/ (the hand-over says so); the demo changes none\n"
        "        from django.contrib.auth.models import Permission\n"
        "        user.user_permissions.set(Permission.objects.filter(\n"
        "            content_type__app_label='marketplace', codename__startswith='view_'))\n"
        "    out[name] = api_token_issue(user=user)\n"
        "print(json.dumps(out))\n"
    )
    return json.loads(stack.run(py, "manage.py", "shell", "-c", script).strip().splitlines()[-1])


def _watch(console, api: httpx.Client, stack: Stack, job_id: int, target: float, server: str) -> int:
    from rich.live import Live
    from rich.table import Table

    rewards: list[float] = []
    first: float | None = None
    seen = 0
    started = time.monotonic()
    reached_at = None
    with Live(console=console, refresh_per_second=2) as live:
        while True:
            stack.check_alive()
            summary = api.get(f"jobs/{job_id}/summary/").raise_for_status().json()
            for row in api.get(f"jobs/{job_id}/metrics/", params={"since": seen}).raise_for_status().json():
                seen = row["step"]
                rewards.append(row["reward_mean"])
                first = rewards[0] if first is None else first
            recent = sum(rewards[-10:]) / len(rewards[-10:]) if rewards else None
            table = Table(title=f"job {job_id} · {time.monotonic() - started:.0f}s · {server}/jobs/{job_id}/",
                          show_header=False)
            table.add_column("figure", style="bold")
            table.add_column("value")
            for label, value in (
                ("status", summary["status"]), ("step", f"{summary['step']} / {summary['max_steps']}"),
                ("mean reward (step, 10-step)", f"{_fmt(summary['reward_mean'])}  {_fmt(recent)}"),
                ("max staleness (S=3)", str(summary["max_staleness"])),
                ("dropped stale", str(summary["dropped_stale"])),
                ("T_train / T_bcast (s)", f"{_fmt(summary['t_train'])} / {_fmt(summary['t_bcast'])}"),
                ("active workers", str(summary["active_workers"])), ("cost so far ($)", f"{summary['cost_usd']:.5f}"),
            ):
                table.add_row(label, value)
            live.update(table)
            if recent is not None and len(rewards) >= 10 and recent >= target and reached_at is None:
                reached_at = time.monotonic() - started
            if summary["status"] in ("completed", "failed", "cancelled"):
                break
            time.sleep(1.0)
    console.print()  # the live table's last line ends without a newline
    staleness = [m["max_staleness"] for m in api.get(f"jobs/{job_id}/metrics/").json()]
    console.print(f"step-0 reward {_fmt(first)} -> 10-step mean {_fmt(recent)} after {len(rewards)} steps; "
                  f"largest staleness trained on: {max(staleness, default=0)} (S=3)")
    if reached_at is not None:
        console.print(f"[green]reward reached {target} in {reached_at:.0f}s: the model learned the task")
        return 0
    console.print(f"[yellow]job ended ({summary['status']}: {summary['status_reason']}) before the reward reached "
                  f"{target}")
    return 2


def _fmt(value) -> str:
    return "-" if value is None else f"{value:.3f}"


if __name__ == "__main__":
    sys.exit(main())

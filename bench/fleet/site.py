"""The real stack for the fleet bench, on loopback: a private redis-server, a fresh PostgreSQL database (dropped at
the end) or a SQLite file, daphne processes sharing them, a Celery worker and beat, and the learner.

Processes are started and stopped through :class:`echo2_site.demo.Stack` (own process groups, logs under
``logs/``), each stopped by its process id. The site runs as in production (``DEBUG`` off, throttles in a shared
Redis cache), except that loopback peers are allowed (everything is on this machine).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("ECHO2_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of a live process (``/proc/<pid>/stat``)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def machine_cpu() -> tuple[int, int]:
    """Busy and total jiffies of every core since boot (``/proc/stat``): the machine's load, whoever causes it."""
    values = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = values[3] + values[4]  # idle + iowait
    return sum(values) - idle, sum(values)


def stop_process(stack: Stack, proc: subprocess.Popen, timeout: float = 10.0) -> None:
    """Stop one process the stack started (its process group, by id): SIGTERM, then SIGKILL after ``timeout``."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
    stack.procs = [(n, p) for n, p in stack.procs if p is not proc]


class Postgres:
    """A fresh database on the machine's PostgreSQL, dropped by :meth:`drop`."""

    def __init__(self, admin_url: str = PG_ADMIN_URL) -> None:
        self.admin_url, self.name = admin_url, f"echo2_fleet_{os.getpid()}"
        self.url = admin_url.rpartition("/")[0] + "/" + self.name
        self.created = False

    def _admin(self):
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)

    def create(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        self.created = True

    def stats(self) -> dict[str, int]:
        """The database's cumulative counters (``pg_stat_database``): transactions and rows touched."""
        with self._admin() as conn:
            row = conn.execute("SELECT xact_commit + xact_rollback, tup_returned, tup_fetched, tup_inserted, "
                               "tup_updated, tup_deleted FROM pg_stat_database WHERE datname = %s",
                               (self.name,)).fetchone()
        xacts, returned, fetched, inserted, updated, deleted = (int(x or 0) for x in row)
        return {"xacts": xacts, "rows_read": returned + fetched, "rows_written": inserted + updated + deleted}

    def drop(self) -> None:
        if self.created:
            with self._admin() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            self.created = False


class Site:
    """The stack of one bench run. ``start_base`` once; then daphne processes, agents and learners per row."""

    def __init__(self, workdir: Path, *, database: str, aof: bool = False) -> None:
        self.workdir, self.aof = workdir, aof
        self.redis_port = free_port()
        self.redis_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.pg = Postgres() if database == "postgres" else None
        db_url = self.pg.url if self.pg else f"sqlite:///{workdir / 'site.sqlite3'}"
        self.env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=self.redis_url, ECHO2_DATA_DIR=str(workdir),
                        DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                        TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
                        # production settings: DEBUG off (no query log), throttles shared by the site processes
                        DEBUG="false", SECRET_KEY="bench-fleet-not-secret", SECURE_SSL_REDIRECT="false",
                        ECHO2_CACHE_URL=f"redis://127.0.0.1:{self.redis_port}/1", LOG_LEVEL="WARNING",
                        ECHO2_ALLOW_LOOPBACK_PEERS="true", ECHO2_CHANNEL_PREFIX="echo2fleet",
                        # the whole fleet stays active while measured (no release after a sustained surplus)
                        ECHO2_REPLAN_INTERVAL_S="3600")
        self.stack = Stack(workdir, self.env)
        self.model_dir = workdir / "tiny-arithmetic"
        self.tokens: dict[str, str] = {}
        self.workers: list[dict] = []
        self.real: list[dict] = []  # workers for real ``echo2-agent run`` processes (the tiny model)
        self.hog: subprocess.Popen | None = None

    # ---- once per run ---------------------------------------------------------------------

    def redis_argv(self) -> tuple[str, ...]:
        """The private redis-server; with ``aof`` an append-only file (every second, never rewritten) that a
        restart reloads and the audit replays (bench/fault_audit.py)."""
        redis_dir = self.workdir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        persist = ("--appendonly", "yes", "--appendfsync", "everysec", "--auto-aof-rewrite-percentage", "0") \
            if self.aof else ("--appendonly", "no")
        return (shutil.which("redis-server") or "redis-server", "--port", str(self.redis_port), "--bind",
                "127.0.0.1", "--save", "", *persist, "--dir", str(redis_dir))

    def start_base(self, *, workers: int, real: int = 0) -> None:
        """Redis, the database (migrated, an owner and a provider with ``workers`` registered, and ``real`` more for
        real agents), the tiny model, Celery worker and beat."""
        self.redis_proc = self.stack.start("redis", *self.redis_argv())
        if self.pg:
            self.pg.create()
        self.stack.run(str(BIN / "echo2-learner"), "init-model", str(self.model_dir), "--task", "arithmetic")
        self.stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
        script = (
            "import json\nfrom decimal import Decimal\nfrom django.contrib.auth.models import User\n"
            "from marketplace.services import api_token_issue, worker_register\n"
            "owner, prov = (User.objects.create_user(n, password=n) for n in ('owner', 'provider'))\n"
            "out = {'tokens': {'owner': api_token_issue(user=owner)}, 'workers': []}\n"
            f"for i in range({workers}):\n"
            "    w, key = worker_register(user=prov, name=f'fleet-{i:05d}', gpu='stand-in', bandwidth_bps=12_500_000,"
            " price_per_hour=Decimal('0.30') + Decimal(i % 50) / 1000)\n"
            "    out['workers'].append({'worker_id': w.pk, 'name': w.name, 'agent_key': key})\n"
            f"for i in range({real}):\n"
            "    w, key = worker_register(user=prov, name=f'real-{i}', gpu='cpu', bandwidth_bps=12_500_000,"
            " price_per_hour=Decimal('0.30'))\n"
            "    out.setdefault('real', []).append({'worker_id': w.pk, 'name': w.name, 'agent_key': key})\n"
            "print(json.dumps(out))\n")
        out = json.loads(self.stack.run(str(BIN / "python"), "manage.py", "shell", "-c", script)
                         .strip().splitlines()[-1])
        self.tokens, self.workers, self.real = out["tokens"], out["workers"], out.get("real", [])
        token_file = self.workdir / "owner.token"
        token_file.touch(mode=0o600)
        token_file.write_text(self.tokens["owner"] + "\n")
        self.stack.start("celery-worker", str(BIN / "celery"), "-A", "echo2_site", "worker", "-l", "warning",
                         "-P", "solo")
        self.stack.start("celery-beat", str(BIN / "celery"), "-A", "echo2_site", "beat", "-l", "warning",
                         "-s", str(self.workdir / "celerybeat-schedule"))

    def start_hog(self) -> None:
        """A process that holds one core busy (a Python spin loop) until :meth:`stop_hog`, stopped by its id."""
        self.hog = self.stack.start("cpu-hog", str(BIN / "python"), "-c", "while True: pass")

    def stop_hog(self) -> None:
        if self.hog is not None:
            stop_process(self.stack, self.hog)
            self.hog = None

    def restart_redis(self) -> float:
        """SIGKILL the private Redis and start it again 1 s later on the same port and AOF; seconds it was
        away (kill to PING)."""
        import redis

        started = time.monotonic()
        os.killpg(self.redis_proc.pid, signal.SIGKILL)
        self.redis_proc.wait(10)
        self.stack.procs = [(n, p) for n, p in self.stack.procs if p is not self.redis_proc]
        time.sleep(1.0)
        self.redis_proc = self.stack.start("redis", *self.redis_argv())
        wait_for(lambda: redis.Redis(port=self.redis_port, socket_timeout=1).ping(), "Redis to restart", 60)
        return time.monotonic() - started

    def stop(self) -> None:
        self.stop_hog()
        try:
            self.stack.stop()
        finally:
            if self.pg:
                self.pg.drop()

    # ---- per row ----------------------------------------------------------------------------

    def start_daphnes(self, count: int, tag: str, ports: list[int] | None = None) -> list[tuple[str, subprocess.Popen]]:
        """``count`` daphne processes on free ports (or on ``ports``: a restart), all answering; returns (URL,
        process) of each."""
        out = []
        for i in range(count):
            port = ports[i] if ports else free_port()
            proc = self.stack.start(f"daphne-{tag}-{i}", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port),
                                    *DAPHNE_WEBSOCKET_LIMITS, "echo2_site.asgi:application")
            out.append((f"http://127.0.0.1:{port}", proc))
        for url, _ in out:
            wait_for(lambda url=url: httpx.get(url + "/healthz", timeout=2).status_code == 200, f"daphne at {url}",
                     90)
        return out

    def start_agents(self, name: str, spec: dict) -> subprocess.Popen:
        path = self.workdir / f"{name}.json"
        path.write_text(json.dumps(spec))
        return self.stack.start(name, str(BIN / "python"), "-m", "bench.fleet.agents", str(path))

    def start_learner(self, name: str, server: str, job_id: int) -> subprocess.Popen:
        return self.stack.start(name, str(BIN / "echo2-learner"), "run", "--server", server, "--job", str(job_id),
                                "--token-file", str(self.workdir / "owner.token"), "--redis", self.redis_url,
                                "--snapshot-dir", str(self.workdir / name / "snapshots"), "--audit-fraction", "0",
                                "--no-tensorboard", "--logdir", str(self.workdir / name / "runs"))

    def api(self, server: str) -> httpx.Client:
        return httpx.Client(base_url=server + "/api/", headers={"Authorization": f"Token {self.tokens['owner']}"},
                            timeout=60)

    def redis(self, *, decode: bool = True):
        import redis

        return redis.Redis(port=self.redis_port, decode_responses=decode, socket_timeout=10)

    def wait(self, check, what: str, timeout: float, poll: float = 0.2) -> float | None:
        """Seconds until ``check()`` holds, or None after ``timeout`` (the stack's processes checked meanwhile)."""
        started = time.monotonic()
        while time.monotonic() - started < timeout:
            if check():
                return time.monotonic() - started
            for name, proc in self.stack.procs:
                if proc.poll() is not None and not name.startswith(("learner", "agents")):
                    raise RuntimeError(f"{name} exited ({proc.returncode}); see {self.stack.logs / (name + '.log')}")
            time.sleep(poll)
        return None

"""A burst of concurrent API requests against a real daphne on PostgreSQL.

Before the connection pool every request thread of daphne opened its own connection and kept it for
``CONN_MAX_AGE`` (60 s): 150 concurrent requests asked for more connections than the server allows, and the late
ones got 500s ("too many clients"). With Django's psycopg pool (``ECHO2_DB_POOL_MAX`` per site process) the burst
queues for the pool's connections instead.

Each row starts daphne on a fresh database with one pool setting (0: no pool, ``CONN_MAX_AGE=60`` as before),
fires ``--requests`` requests at once (one thread and one TCP connection each, released together: a third carry a
wrong API token, the rest the owner's on ``GET /api/jobs/``, ``/api/workers/`` and a job's detail), samples the
database's connections in ``pg_stat_activity`` every 5 ms, and prints a table: answers by class, the most
connections the site held, the server's limit, latency. By default it runs its own PostgreSQL (``initdb`` into a
temporary folder, ``--max-connections`` like a stock server's 100), so the row without a pool exhausts nobody
else's server; ``--admin-url postgres://...`` uses an existing one instead (a database made and dropped per row).

    .venv/bin/python bench/bench_db_burst.py [--requests 150] [--pool 0 10 20] [--max-connections 100]

``tests/test_db_burst.py`` runs one row with the pool on the test suite's PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from echo2_site.demo import Stack, free_port, wait_for  # noqa: E402

BIN = Path(sys.executable).parent


class PrivatePostgres:
    """A PostgreSQL server of our own in a temporary folder (as the ``postgres`` user when we are root, which
    ``initdb`` refuses to be), on a free loopback port, stopped and removed by :meth:`stop`."""

    def __init__(self, *, max_connections: int = 100) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="echo2-pg-"))
        self.port, self.max_connections = free_port(), max_connections
        self.admin_url = f"postgres://postgres@127.0.0.1:{self.port}/postgres"

    def _run(self, *argv: str) -> None:
        prefix = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)

    def start(self) -> PrivatePostgres:
        bin_dir = _pg_bin()
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres")
        self._run(str(bin_dir / "initdb"), "-D", str(self.dir / "data"), "-U", "postgres", "--auth=trust", "-E", "UTF8")
        options = (f"-p {self.port} -c listen_addresses=127.0.0.1 -c unix_socket_directories={self.dir} "
                   f"-c max_connections={self.max_connections} -c fsync=off")
        self._run(str(bin_dir / "pg_ctl"), "-D", str(self.dir / "data"), "-o", options, "-l",
                  str(self.dir / "server.log"), "-w", "start")
        return self

    def stop(self) -> None:
        with contextlib.suppress(subprocess.CalledProcessError):
            self._run(str(_pg_bin() / "pg_ctl"), "-D", str(self.dir / "data"), "-m", "immediate", "stop")
        shutil.rmtree(self.dir, ignore_errors=True)


def _pg_bin() -> Path:
    found = shutil.which("initdb")
    if found:
        return Path(found).parent
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not versions:
        raise RuntimeError("no initdb: install PostgreSQL, or pass --admin-url of a server to use")
    return versions[-1].parent


class Database:
    """A fresh database on the server ``admin_url`` names, dropped by :meth:`drop`; :meth:`connections` counts the
    client connections to it."""

    def __init__(self, admin_url: str, name: str) -> None:
        self.admin_url, self.name = admin_url, name
        self.url = admin_url.rpartition("/")[0] + "/" + name

    def _admin(self):
        import psycopg

        return psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10)

    def create(self) -> Database:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def drop(self) -> None:
        with self._admin() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')

    def max_connections(self) -> int:
        with self._admin() as conn:
            return int(conn.execute("SHOW max_connections").fetchone()[0])


class ConnectionSampler:
    """Counts the connections to one database every ``period_s`` from a thread of its own, over one connection to
    the server's ``postgres`` database (not counted); ``peak`` is the most seen."""

    def __init__(self, db: Database, *, period_s: float = 0.005) -> None:
        self.db, self.period_s, self.peak, self.samples = db, period_s, 0, 0
        self.stopped = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pg-sampler", daemon=True)

    def __enter__(self) -> ConnectionSampler:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stopped.set()
        self.thread.join(10)

    def _run(self) -> None:
        with self.db._admin() as conn:
            while not self.stopped.is_set():
                count = conn.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = %s",
                                     (self.db.name,)).fetchone()[0]
                self.peak, self.samples = max(self.peak, int(count)), self.samples + 1
                time.sleep(self.period_s)


@dataclass
class Burst:
    """What one burst got back."""

    statuses: list[int] = field(default_factory=list)  # 0: no answer (connection refused, reset, timed out)
    seconds: list[float] = field(default_factory=list)

    def count(self, low: int, high: int) -> int:
        return sum(low <= s < high for s in self.statuses)

    @property
    def server_errors(self) -> int:
        return self.count(500, 600) + self.statuses.count(0)

    def latency(self, q: float) -> float:
        ordered = sorted(self.seconds)
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def burst(server: str, token: str, job_id: int, *, requests: int, timeout_s: float = 60.0) -> Burst:
    """``requests`` requests released at once, each on its own thread and TCP connection: every third with a wrong
    API token, the others the owner's on the job list, the worker list and the job's detail."""
    paths = ["/api/jobs/", "/api/workers/", f"/api/jobs/{job_id}/"]
    ready, out, lock = threading.Barrier(requests), Burst(), threading.Lock()

    def one(i: int) -> None:
        wrong = i % 3 == 2
        headers = {"Authorization": f"Token {'e2u_' + 'x' * 40 if wrong else token}"}
        ready.wait()
        start = time.monotonic()
        try:
            status = httpx.get(server + paths[i % len(paths)], headers=headers, timeout=timeout_s).status_code
        except httpx.HTTPError:
            status = 0
        with lock:
            out.statuses.append(status)
            out.seconds.append(time.monotonic() - start)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(requests)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s + 10)
    return out


SETUP = """
import json
from django.contrib.auth.models import User
from dataplane.jobs import parse_job_spec
from marketplace import services
from tests.marketplace.factories import checkpoint_dir
owner = User.objects.create_user("burst", password="burst-pass")
job = services.job_create(owner=owner, spec=parse_job_spec({"name": "burst", "model_dir": checkpoint_dir(),
                                                             "task": {"name": "arithmetic"}}))
print(json.dumps({"token": services.api_token_issue(user=owner), "job": job.pk}))
"""


def site_env(workdir: Path, database_url: str, redis_url: str, *, pool_max: int) -> dict[str, str]:
    """The site's environment for one row: the database, its pool (0: none, CONN_MAX_AGE 60 as before), throttles
    out of the way (this measures connections, not rates)."""
    return dict(os.environ, DATABASE_URL=database_url, REDIS_URL=redis_url, ECHO2_DATA_DIR=str(workdir),
                DJANGO_SETTINGS_MODULE="echo2_site.settings", PYTHONUNBUFFERED="1", DEBUG="false",
                SECRET_KEY="bench-" + "k" * 50, SECURE_SSL_REDIRECT="false", ALLOWED_HOSTS="127.0.0.1",
                ECHO2_CHANNEL_PREFIX=f"echo2-burst-{os.getpid()}", ECHO2_DB_POOL_MAX=str(pool_max),
                CONN_MAX_AGE="60", ECHO2_THROTTLE_USER="1000000/s", ECHO2_THROTTLE_AUTH_FAILURES="1000000/min")


def start_site(stack: Stack, setup: str) -> tuple[str, dict]:
    """The site of ``stack`` on its fresh database: migrated, ``setup`` run (a ``manage.py shell`` script printing
    one JSON line), daphne started and answering; (its URL, what ``setup`` printed)."""
    stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
    made = json.loads(stack.run(str(BIN / "python"), "manage.py", "shell", "-c", setup).strip().splitlines()[-1])
    port = free_port()
    stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "echo2_site.asgi:application")
    server = f"http://127.0.0.1:{port}"
    wait_for(lambda: httpx.get(server + "/healthz", timeout=2).status_code == 200, "the site", 60)
    return server, made


def run_row(db: Database, redis_url: str, *, pool_max: int, requests: int, workdir: Path) -> dict:
    """One row: a fresh database, migrated, a user and a job, daphne, the burst, the peak of connections."""
    db.create()
    stack = Stack(workdir, site_env(workdir, db.url, redis_url, pool_max=pool_max))
    try:
        server, made = start_site(stack, SETUP)
        with ConnectionSampler(db) as sampler:
            got = burst(server, made["token"], made["job"], requests=requests)
            time.sleep(0.2)
        return {"pool_max": pool_max, "requests": requests, "ok": got.count(200, 300), "4xx": got.count(400, 500),
                "5xx": got.server_errors, "peak": sampler.peak, "samples": sampler.samples,
                "limit": db.max_connections(), "p50": got.latency(0.5), "p99": got.latency(0.99),
                "logs": str(stack.logs)}
    finally:
        stack.stop()
        db.drop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=150, help="concurrent requests per row (default 150)")
    parser.add_argument("--pool", type=int, nargs="+", default=[0, 10, 20],
                        help="ECHO2_DB_POOL_MAX per row; 0: no pool, CONN_MAX_AGE=60 as before (default 0 10 20)")
    parser.add_argument("--max-connections", type=int, default=100, help="the private server's max_connections")
    parser.add_argument("--admin-url", help="an existing server's postgres://.../postgres instead of a private one")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    args = parser.parse_args()
    server = None if args.admin_url else PrivatePostgres(max_connections=args.max_connections).start()
    admin_url = args.admin_url or server.admin_url
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="echo2-burst-") as tmp:
            for pool_max in args.pool:
                db = Database(admin_url, f"echo2_burst_{os.getpid()}")
                rows.append(run_row(db, args.redis_url, pool_max=pool_max, requests=args.requests,
                                    workdir=Path(tmp) / f"pool{pool_max}"))
    finally:
        if server is not None:
            server.stop()
    print(f"{'pool max':>8} | {'requests':>8} | {'2xx':>4} | {'4xx':>4} | {'5xx/none':>8} | {'peak conns':>10} | "
          f"{'server limit':>12} | {'p50 s':>6} | {'p99 s':>6}")
    for row in rows:
        pool = row["pool_max"] or "none"
        print(f"{pool:>8} | {row['requests']:>8} | {row['ok']:>4} | {row['4xx']:>4} | {row['5xx']:>8} | "
              f"{row['peak']:>10} | {row['limit']:>12} | {row['p50']:>6.2f} | {row['p99']:>6.2f}")


if __name__ == "__main__":
    main()

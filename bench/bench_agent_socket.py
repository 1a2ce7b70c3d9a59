"""How many agents one site process holds: connect, heartbeats handled on time, disconnects recorded (issue 25).

Run: ``.venv/bin/python bench/bench_agent_socket.py [--agents 100 300 1000] [--interval 2] [--seconds 30]
[--storm 1000] [--agents] [--database postgres|sqlite] [--root PATH]``

Starts its own stack on loopback: a private redis-server on a free port, a fresh PostgreSQL database (dropped at the
end; SQLite when PostgreSQL is not reachable or ``--database sqlite``), one daphne, a Celery worker and beat, all
run from ``--root`` (default: this checkout; another checkout, e.g. a ``git worktree`` of an older commit, gives the
"before" figures with the same harness). Registers the largest N workers, then for each N: N asyncio websocket
clients (the ``websockets`` library, each with its own agent key) connect and say hello, heartbeat for
``--seconds`` at ``--interval`` (default: the site's 2 s), and all close at once. Then, for each ``--storm`` N
(default 1000; ``--storm`` alone: none), a *storm* row: N agents connect at once, as a fleet reconnects after a
site restart, each heartbeating from its own ``welcome`` on while the others still connect, for ``--seconds``
from the storm's start.

What is measured, and how:
- *all connected*: from the first connect to the last ``welcome`` (64 connects in flight at a time, a storm all
  at once; a refused or failed connect is retried after 1 s and counted).
- *handshake*: per agent, from its connect's start (its turn, in the gentle rows) to its ``welcome``: the
  websocket handshake, the hello and the site's provisioning, retries included.
- *heartbeat handling*: each heartbeat carries its sequence number as its ``throughput`` figure; the site records
  every heartbeat it handles as a telemetry sample ``[handled at, throughput]`` in Redis
  (``marketplace.infra.telemetry.record_heartbeat``: before this issue at the start of the database work, since then in
  the Redis-only path). Latency = handled at - sent at (one machine, one clock), read from Redis 3 s after the
  last heartbeat; a heartbeat with no sample by then was never handled (counted; its latency is unknown, so the
  percentiles are over handled ones and the "within 1 s" share is over all sent).
- *daphne CPU*: its user + system CPU seconds over the heartbeat phase (a storm: from its start), divided by the
  phase's wall time.
- *disconnects*: every socket closed at once; then the database is polled until every session is ended and every
  worker offline (or 30 s): how many were recorded and how long it took.

Kills only the processes it started, by process id (their process groups).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for  # noqa: E402

BIN = Path(sys.executable).parent
PG_ADMIN_URL = os.environ.get("ECHO2_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
CONNECTS_IN_FLIGHT = 64
MAX_RETRIES = 200  # failed connects per row before the bench gives up and says why


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


# ---- the agents ------------------------------------------------------------------------------------------


async def _connect(url: str, key: str, stats: dict):
    import websockets

    started = time.time()
    while True:
        try:
            ws = await websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"},
                                          ping_interval=None, open_timeout=30, max_size=None)
            stats["last_error"] = "connected, no welcome"
            await ws.send(json.dumps({"type": "hello", "agent_version": "bench"}))
            while (reply := json.loads(await asyncio.wait_for(ws.recv(), 60)))["type"] != "welcome":
                stats["last_error"] = f"before the welcome: {reply}"[:200]
            stats["handshakes"].append(time.time() - started)
            return ws
        except Exception as err:  # noqa: BLE001 - any failed connect is retried
            stats["retries"] += 1
            stats["last_error"] = f"{type(err).__name__}: {err}"[:200]
            if stats["retries"] > MAX_RETRIES:
                raise RuntimeError(f"{stats['retries']} connects failed; the last: {stats['last_error']}") from err
            await asyncio.sleep(1.0)


async def _beat(ws, sent: list[float], *, interval: float, until: float) -> None:
    """Heartbeats every ``interval`` from a random phase until ``until``; ``sent[i]`` is when number ``i`` left."""
    await asyncio.sleep(random.uniform(0, interval))
    while time.time() < until:
        sent.append(time.time())
        await ws.send(json.dumps({"type": "heartbeat", "throughput": float(len(sent) - 1), "state": "idle"}))
        await asyncio.sleep(interval)


async def _drain(ws) -> None:
    """Read (and drop) whatever the site sends, so its socket never blocks on us."""
    try:
        async for _ in ws:
            pass
    except Exception:  # noqa: BLE001 - the socket closed
        return


async def run_agents(url: str, workers: list[dict], *, interval: float, seconds: float, on_phase=None) -> dict:
    """Connect ``workers`` (``worker_id``, ``agent_key``), heartbeat, close all at once. Returns the raw timings:
    connect span, retries, per worker the send times of its heartbeats, the heartbeat phase's bounds.
    ``on_phase()`` is called as the heartbeat phase starts and as it ends."""
    stats = {"retries": 0, "last_error": "", "handshakes": []}
    gate = asyncio.Semaphore(CONNECTS_IN_FLIGHT)

    async def one(w):
        async with gate:
            return await _connect(url, w["agent_key"], stats)

    start = time.time()
    sockets = await asyncio.gather(*(one(w) for w in workers))
    connected = time.time() - start
    drains = [asyncio.create_task(_drain(ws)) for ws in sockets]
    sent: dict[int, list[float]] = {w["worker_id"]: [] for w in workers}
    if on_phase:
        on_phase()
    phase_start = time.time()
    until = phase_start + seconds
    await asyncio.gather(*(_beat(ws, sent[w["worker_id"]], interval=interval, until=until)
                           for ws, w in zip(sockets, workers, strict=True)))
    phase_end = time.time()
    if on_phase:
        on_phase()
    await asyncio.sleep(3.0)  # the tail of the last heartbeats
    closed_at = time.time()
    await asyncio.gather(*(ws.close() for ws in sockets), return_exceptions=True)
    for task in drains:
        task.cancel()
    return {"connected_s": connected, "retries": stats["retries"], "last_error": stats["last_error"], "sent": sent,
            "phase": (phase_start, phase_end), "closed_at": closed_at, "handshakes": stats["handshakes"]}


async def run_storm(url: str, workers: list[dict], *, interval: float, seconds: float, on_phase=None) -> dict:
    """As ``run_agents``, but every agent connects at once and heartbeats from its own ``welcome`` until
    ``seconds`` after the storm began: the heartbeats of the first connected meet the handshakes of the rest."""
    stats = {"retries": 0, "last_error": "", "handshakes": []}
    sent: dict[int, list[float]] = {w["worker_id"]: [] for w in workers}
    welcomed: list[float] = []
    if on_phase:
        on_phase()
    start = time.time()
    until = start + seconds

    async def one(w):
        ws = await _connect(url, w["agent_key"], stats)
        welcomed.append(time.time())
        drain = asyncio.create_task(_drain(ws))
        await _beat(ws, sent[w["worker_id"]], interval=interval, until=until)
        return ws, drain

    done = await asyncio.gather(*(one(w) for w in workers))
    phase_end = time.time()
    if on_phase:
        on_phase()
    await asyncio.sleep(3.0)  # the tail of the last heartbeats
    closed_at = time.time()
    await asyncio.gather(*(ws.close() for ws, _ in done), return_exceptions=True)
    for _, task in done:
        task.cancel()
    return {"connected_s": max(welcomed) - start, "retries": stats["retries"], "last_error": stats["last_error"],
            "sent": sent, "phase": (start, phase_end), "closed_at": closed_at, "handshakes": stats["handshakes"]}


def heartbeat_latencies(redis_client, sent: dict[int, list[float]]) -> tuple[list[float], int, int]:
    """(latencies of handled heartbeats, handled, sent) from the site's telemetry samples in Redis."""
    pipe = redis_client.pipeline()
    for wid in sent:
        pipe.lrange(f"echo2:worker:{wid}:heartbeats", 0, -1)
    latencies, total = [], 0
    for times, rows in zip(sent.values(), pipe.execute(), strict=True):
        total += len(times)
        handled = {}
        for row in rows:
            at, seq = json.loads(row)
            if seq is not None and int(seq) < len(times):
                handled[int(seq)] = float(at)
        latencies += [handled[i] - times[i] for i in handled]
    return latencies, len(latencies), total


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


# ---- the stack ------------------------------------------------------------------------------------------


class RootedStack(Stack):
    """``demo.Stack`` whose processes run in ``root``: daphne imports the site from its working directory (it puts
    ``.`` first on its path), so the checkout measured must be the working directory, not only ``PYTHONPATH``."""

    def __init__(self, workdir: Path, env: dict[str, str], root: Path) -> None:
        super().__init__(workdir, env)
        self.root = root

    def start(self, name: str, *argv: str):
        import subprocess

        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 - closed with the process
        proc = subprocess.Popen(argv, cwd=self.root, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        self.procs.append((name, proc))
        return proc

    def run(self, *argv: str) -> str:
        import subprocess

        done = subprocess.run(argv, cwd=self.root, env=self.env, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(argv[:3])} failed:\n{done.stdout}\n{done.stderr}")
        return done.stdout


class Bench:
    def __init__(self, workdir: Path, *, root: Path, database: str) -> None:
        self.workdir, self.root = workdir, root
        self.redis_port, self.site_port = free_port(), free_port()
        self.pg_name = None
        db_url = f"sqlite:///{workdir / 'site.sqlite3'}"
        if database == "postgres":
            self.pg_name = f"echo2_bench_socket_{os.getpid()}"
            db_url = PG_ADMIN_URL.rpartition("/")[0] + "/" + self.pg_name
        self.db_url = db_url
        self.env = dict(os.environ, DATABASE_URL=db_url, REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0",
                        ECHO2_DATA_DIR=str(workdir), DJANGO_SETTINGS_MODULE="echo2_site.settings",
                        PYTHONUNBUFFERED="1", PYTHONPATH=str(root), DEBUG="false", SECRET_KEY="bench-not-secret",
                        SECURE_SSL_REDIRECT="false", ECHO2_CACHE_URL=f"redis://127.0.0.1:{self.redis_port}/1",
                        LOG_LEVEL="WARNING", ECHO2_ALLOW_LOOPBACK_PEERS="true")
        self.stack = RootedStack(workdir, self.env, root)
        self.daphne = None

    def _pg(self):
        import psycopg

        return psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10)

    def start(self, workers: int) -> list[dict]:
        redis_dir = self.workdir / "redis"
        redis_dir.mkdir(parents=True, exist_ok=True)
        self.stack.start("redis", shutil.which("redis-server") or "redis-server", "--port", str(self.redis_port),
                         "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(redis_dir))
        if self.pg_name:
            with self._pg() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')
                conn.execute(f'CREATE DATABASE "{self.pg_name}"')
        py = str(BIN / "python")
        self.stack.run(py, "manage.py", "migrate", "--noinput")
        script = (
            "import json\nfrom decimal import Decimal\nfrom django.contrib.auth.models import User\n"
            "from marketplace.services import worker_register\n"
            "prov = User.objects.create_user('provider', password='provider')\nout = []\n"
            f"for i in range({workers}):\n"
            "    w, key = worker_register(user=prov, name=f'bench-{i:05d}', gpu='none', bandwidth_bps=12_500_000,"
            " price_per_hour=Decimal('0.30'))\n"
            "    out.append({'worker_id': w.pk, 'agent_key': key})\n"
            "print(json.dumps(out))\n")
        out = self.stack.run(py, "manage.py", "shell", "-c", script)
        registered = json.loads(out.strip().splitlines()[-1])
        self.daphne = self.stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.site_port),
                                       *DAPHNE_WEBSOCKET_LIMITS, "echo2_site.asgi:application")
        self.stack.start("celery-worker", str(BIN / "celery"), "-A", "echo2_site", "worker", "-l", "warning",
                         "-P", "solo")
        self.stack.start("celery-beat", str(BIN / "celery"), "-A", "echo2_site", "beat", "-l", "warning",
                         "-s", str(self.workdir / "celerybeat-schedule"))
        import httpx

        wait_for(lambda: httpx.get(f"http://127.0.0.1:{self.site_port}/healthz", timeout=2).status_code == 200,
                 "the site", 60)
        return registered

    def db_state(self, worker_ids: list[int]) -> tuple[int, int]:
        """(open sessions, workers not offline) among ``worker_ids``."""
        ids = ",".join(str(w) for w in worker_ids)
        sql = (f"SELECT (SELECT count(*) FROM marketplace_workersession WHERE ended_at IS NULL"
               f" AND worker_id IN ({ids})), (SELECT count(*) FROM marketplace_worker"
               f" WHERE status != 'offline' AND id IN ({ids}))")
        if self.pg_name:
            import psycopg

            with psycopg.connect(self.db_url, autocommit=True) as conn:
                return tuple(conn.execute(sql).fetchone())
        import sqlite3

        with sqlite3.connect(self.workdir / "site.sqlite3", timeout=30) as conn:
            return tuple(conn.execute(sql).fetchone())

    def stop(self) -> None:
        self.stack.stop()
        if self.pg_name:
            with self._pg() as conn:
                conn.execute(f'DROP DATABASE IF EXISTS "{self.pg_name}" WITH (FORCE)')


def measure(bench: Bench, workers: list[dict], *, interval: float, seconds: float, storm: bool = False) -> dict:
    """One row: connect ``workers`` (a ramp, or all at once), heartbeat, close all; the figures of the table."""
    import redis

    client = redis.Redis(port=bench.redis_port, decode_responses=True)
    # an earlier row's samples of the same workers carry the same sequence numbers: they would pass for this row's
    client.delete(*(f"echo2:worker:{w['worker_id']}:heartbeats" for w in workers))
    cpu: list[float] = []
    url = f"ws://127.0.0.1:{bench.site_port}/ws/agent/"
    run = run_storm if storm else run_agents
    raw = asyncio.run(run(url, workers, interval=interval, seconds=seconds,
                          on_phase=lambda: cpu.append(cpu_seconds(bench.daphne.pid))))
    latencies, handled, total = heartbeat_latencies(client, raw["sent"])
    ids = [w["worker_id"] for w in workers]
    deadline, recorded_s = time.time() + 30, None
    while time.time() < deadline:
        open_sessions, online = bench.db_state(ids)
        if open_sessions == 0 and online == 0:
            recorded_s = time.time() - raw["closed_at"]
            break
        time.sleep(0.25)
    open_sessions, online = bench.db_state(ids)
    client.close()
    within = sum(1 for x in latencies if x <= 1.0)
    return {"agents": len(workers), "storm": storm, "handshake_p50": percentile(raw["handshakes"], 0.5),
            "handshake_p99": percentile(raw["handshakes"], 0.99), "connected_s": raw["connected_s"],
            "retries": raw["retries"], "last_error": raw["last_error"], "sent": total, "handled": handled,
            "within_1s": within / total if total else float("nan"),
            "p50": percentile(latencies, 0.5), "p99": percentile(latencies, 0.99),
            "daphne_cpu": (cpu[1] - cpu[0]) / (raw["phase"][1] - raw["phase"][0]),
            "closed_recorded": len(ids) - max(open_sessions, online), "recorded_s": recorded_s,
            "open_sessions": open_sessions, "not_offline": online}


def _ms(x: float) -> str:
    return "n/a" if x != x else (f"{x * 1000:.0f} ms" if x < 1 else f"{x:.2f} s")


def _row(row: dict) -> str:
    n = row["agents"]
    retried = f" ({row['retries']} connects retried)" if row["retries"] else ""
    recorded = (f"{row['closed_recorded']}/{n} in {row['recorded_s']:.1f} s" if row["recorded_s"] is not None
                else f"{row['closed_recorded']}/{n} after 30 s ({row['open_sessions']} sessions open, "
                     f"{row['not_offline']} not offline)")
    return (f"| {n}{' at once' if row['storm'] else ''} | {row['connected_s']:.1f} s{retried} | "
            f"{_ms(row['handshake_p50'])} / {_ms(row['handshake_p99'])} | {100 * row['within_1s']:.1f}% | "
            f"{row['sent'] - row['handled']}/{row['sent']} | {_ms(row['p50'])} / {_ms(row['p99'])} | "
            f"{100 * row['daphne_cpu']:.0f}% | {recorded} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--agents", type=int, nargs="*", default=[100, 300, 1000],
                        help="Agents connecting in a gentle ramp, a row each (none: the storm rows only).")
    parser.add_argument("--interval", type=float, default=2.0, help="Seconds between an agent's heartbeats.")
    parser.add_argument("--seconds", type=float, default=30.0, help="Heartbeat phase per row.")
    parser.add_argument("--storm", type=int, nargs="*", default=[1000],
                        help="Agents connecting all at once, a row each (none: the ramp only).")
    parser.add_argument("--database", choices=["postgres", "sqlite"], default="postgres")
    parser.add_argument("--root", type=Path, default=ROOT, help="Checkout the site runs from.")
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    args = parser.parse_args(argv)
    if args.database == "postgres":
        try:
            import psycopg

            psycopg.connect(PG_ADMIN_URL, connect_timeout=3).close()
        except Exception as err:  # noqa: BLE001 - any reason PostgreSQL is not there
            print(f"PostgreSQL not reachable ({err}); using SQLite")
            args.database = "sqlite"
    workdir = Path(tempfile.mkdtemp(prefix="echo2-bench-socket-"))
    bench = Bench(workdir, root=args.root.resolve(), database=args.database)
    rows = []
    try:
        registered = bench.start(max(args.agents + args.storm))
        print(f"site from {args.root} on {args.database}; heartbeats every {args.interval:g} s for {args.seconds:g} s")
        print("| agents | all connected | handshake p50 / p99 | heartbeats handled within 1 s | never handled "
              "| p50 / p99 | daphne CPU | disconnects recorded |")
        print("| --- | --- | --- | --- | --- | --- | --- | --- |")
        for n, storm in [(n, False) for n in args.agents] + [(n, True) for n in args.storm]:
            row = measure(bench, registered[:n], interval=args.interval, seconds=args.seconds, storm=storm)
            rows.append(row)
            print(_row(row), flush=True)
            time.sleep(2)
    except BaseException:
        print(f"failed; the stack's logs are kept in {workdir / 'logs'}")
        bench.stop()
        raise
    else:
        bench.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

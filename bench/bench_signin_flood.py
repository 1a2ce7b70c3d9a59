"""Anonymous sign-in floods against a real daphne on PostgreSQL, beside an honest agent and an owner.

Each attacker fetches the sign-in form (its CSRF cookie and token, as a browser does), then all post a wrong
password at once, each from its own loopback source address (127.1.x.y: Linux routes all of 127/8 to lo), so
the per-address bucket alone cannot hold them and the site-wide bucket and the in-flight cap of
``echo2_site/gate.py`` must. Meanwhile an honest agent opens its socket and says hello (a round trip through
the database: ``worker_connected``) and the owner reads its job over the API, each again and again; the table
gives the flood's answers by class and the slowest agent round trip and owner read while it lasted.

A row with ``--gate off`` raises the gate's limits out of reach: the site as it was (sign-ins take the pool's
connections, hash passwords, and the rest wait for ECHO2_DB_POOL_TIMEOUT_S, then 500/503).

    .venv/bin/python bench/bench_signin_flood.py [--floods 120 300] [--gate on off]

Runs on a fresh database of the PostgreSQL at ``--admin-url`` (made and dropped), daphne on a free port.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from bench.bench_db_burst import BIN, Database, site_env  # noqa: E402
from echo2_site.demo import Stack, free_port, wait_for  # noqa: E402

SETUP = """
import json
from decimal import Decimal
from django.contrib.auth.models import User
from dataplane.jobs import parse_job_spec
from marketplace import services
from marketplace.services import worker_register
from tests.marketplace.factories import checkpoint_dir
owner = User.objects.create_user("owner", password="owner-pass-123")
job = services.job_create(owner=owner, spec=parse_job_spec({"name": "flood", "model_dir": checkpoint_dir(),
                                                             "task": {"name": "arithmetic"}}))
prov = User.objects.create_user("provider", password="provider-pass-123")
w, key = worker_register(user=prov, name="honest", gpu="none", bandwidth_bps=12_500_000, price_per_hour=Decimal("0.3"))
print(json.dumps({"token": services.api_token_issue(user=owner), "job": job.pk, "agent_key": key}))
"""
GATE_OFF = {"ECHO2_SIGNIN_PER_ADDRESS": "1000000", "ECHO2_SIGNIN_PER_MIN": "100000000",
            "ECHO2_SIGNIN_INFLIGHT": "1000000", "ECHO2_ANON_INFLIGHT": "1000000"}
TOKEN = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')


def flood(server: str, attackers: int, timeout_s: float) -> list[int]:
    """``attackers`` sign-ins with a wrong password, released at once, each from its own source address."""
    ready, statuses, lock = threading.Barrier(attackers), [], threading.Lock()

    def one(i: int) -> None:
        address = f"127.1.{i // 200}.{i % 200 + 1}"
        status = 0
        try:
            with httpx.Client(transport=httpx.HTTPTransport(local_address=address), timeout=timeout_s) as client:
                for _ in range(100):  # a busy site answers 503: ask for the form again, as a script would
                    form = client.get(server + "/accounts/login/")
                    if form.status_code != 503:
                        break
                    time.sleep(0.2)
                token = TOKEN.search(form.text)
                ready.wait(timeout_s)
                status = client.post(server + "/accounts/login/", data={
                    "username": "owner", "password": f"guess-{i}", "csrfmiddlewaretoken": token.group(1) if token
                    else ""}, headers={"Referer": server + "/accounts/login/"}).status_code
        except (httpx.HTTPError, threading.BrokenBarrierError):
            status = 0
        with lock:
            statuses.append(status)

    threads = [threading.Thread(target=one, args=(i,), daemon=True) for i in range(attackers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout_s * 2 + 10)
    return statuses


async def _agent_round_trip(url: str, key: str) -> float:
    import websockets

    start = time.monotonic()
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"}, ping_interval=None,
                                  open_timeout=30) as ws:
        await ws.send(json.dumps({"type": "hello", "agent_version": "bench"}))
        while json.loads(await asyncio.wait_for(ws.recv(), 30))["type"] != "welcome":
            pass
    return time.monotonic() - start


def honest(server: str, made: dict, stop: threading.Event, out: dict, rounds: int = 10**9) -> None:
    """The agent's hello round trips and the owner's reads, one after another until ``stop`` (at least once)."""
    ws_url = server.replace("http://", "ws://") + "/ws/agent/"
    headers = {"Authorization": f"Token {made['token']}"}
    with httpx.Client(timeout=30) as client:
        for _ in range(rounds):
            try:
                out["agent"].append(asyncio.run(_agent_round_trip(ws_url, made["agent_key"])))
            except Exception as err:  # noqa: BLE001 - a failed round trip is what this counts
                out["agent_failed"] += 1
                out["agent_error"] = f"{type(err).__name__}: {err}"[:200]
            start = time.monotonic()
            status = client.get(f"{server}/api/jobs/{made['job']}/", headers=headers).status_code
            out["owner"].append(time.monotonic() - start)
            out["owner_failed"] += status != 200
            if stop.is_set():
                break
            time.sleep(0.5)  # the site limits how often one agent key may connect (close code 4429)


def run_row(db: Database, redis_url: str, workdir: Path, made: dict, *, attackers: int, gate: bool) -> dict:
    env = site_env(workdir, db.url, redis_url, pool_max=20)
    env.update({} if gate else GATE_OFF)
    env.pop("CONN_MAX_AGE", None)
    env["CSRF_COOKIE_SECURE"] = "false"  # plain HTTP here: the flood's posts must carry a valid CSRF token
    stack = Stack(workdir, env)
    port = free_port()
    stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(port), "echo2_site.asgi:application")
    server = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: httpx.get(server + "/healthz", timeout=2).status_code == 200, "the site", 60)
        warm = {"agent": [], "owner": [], "agent_failed": 0, "owner_failed": 0}
        once = threading.Event()
        once.set()  # one round of each before the flood: the first connection's imports are not the flood's
        honest(server, made, once, warm, rounds=1)
        out = {"agent": [], "owner": [], "agent_failed": 0, "owner_failed": 0}
        stop = threading.Event()
        watcher = threading.Thread(target=honest, args=(server, made, stop, out), daemon=True)
        started = time.monotonic()
        watcher.start()
        statuses = flood(server, attackers, timeout_s=60)
        seconds = time.monotonic() - started
        stop.set()
        watcher.join(60)
        return {"gate": "on" if gate else "off", "attackers": attackers, "seconds": seconds,
                "2xx/3xx": sum(200 <= s < 400 for s in statuses), "403": statuses.count(403),
                "429": statuses.count(429), "500": statuses.count(500), "503": statuses.count(503),
                "none": statuses.count(0), "agent_max": max(out["agent"], default=float("nan")),
                "agent_p50": sorted(out["agent"])[len(out["agent"]) // 2] if out["agent"] else float("nan"),
                "agent_n": len(out["agent"]), "agent_failed": out["agent_failed"],
                "owner_max": max(out["owner"], default=float("nan")),
                "owner_p50": sorted(out["owner"])[len(out["owner"]) // 2] if out["owner"] else float("nan"),
                "owner_failed": out["owner_failed"],
                "agent_error": out.get("agent_error")}
    finally:
        stack.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--floods", type=int, nargs="+", default=[120, 300], help="concurrent sign-ins per row")
    parser.add_argument("--gate", nargs="+", default=["on"], choices=["on", "off"])
    parser.add_argument("--admin-url", default="postgres://postgres@127.0.0.1:5432/postgres")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    args = parser.parse_args()
    db = Database(args.admin_url, f"echo2_flood_{os.getpid()}").create()
    rows = []
    try:
        with tempfile.TemporaryDirectory(prefix="echo2-flood-") as tmp:
            setup = Stack(Path(tmp) / "setup", site_env(Path(tmp), db.url, args.redis_url, pool_max=20))
            setup.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
            made = setup.run(str(BIN / "python"), "manage.py", "shell", "-c", SETUP)
            made = json.loads(made.strip().splitlines()[-1])
            for gate in args.gate:
                for attackers in args.floods:
                    rows.append(run_row(db, args.redis_url, Path(tmp) / f"{gate}{attackers}", made,
                                        attackers=attackers, gate=gate == "on"))
    finally:
        db.drop()
    print(f"{'gate':>4} | {'sign-ins':>8} | {'200':>4} | {'403':>4} | {'429':>4} | {'500':>4} | {'503':>4} | "
          f"{'none':>4} | {'agent hellos':>12} | {'agent p50/max s':>15} | {'owner p50/max s':>15} | "
          f"{'failed a/o':>10} | "
          f"{'flood s':>7}")
    for r in rows:
        print(f"{r['gate']:>4} | {r['attackers']:>8} | {r['2xx/3xx']:>4} | {r['403']:>4} | {r['429']:>4} | "
              f"{r['500']:>4} | {r['503']:>4} | "
              f"{r['none']:>4} | {r['agent_n']:>12} | {r['agent_p50']:>7.2f}/{r['agent_max']:<7.2f} | "
              f"{r['owner_p50']:>7.2f}/{r['owner_max']:<7.2f} | "
              f"{r['agent_failed']:>4}/{r['owner_failed']:<5} | {r['seconds']:>7.1f}")
    for r in rows:
        if r.get("agent_error"):
            print(f"gate {r['gate']}, {r['attackers']}: the agent's last failure: {r['agent_error']}")
    print("goal: 0 x 500, agent round trips < 2 s, owner reads < 1 s (issue 48); 200: a wrong password's form "
          "shown again (the post was let through and checked)")


if __name__ == "__main__":
    main()

"""Ingest at fleet speed: records/s the site takes in over real websockets, against raw Redis.

Run: ``.venv/bin/python bench/bench_ingest.py [--k 1 4 16] [--shapes demo long] [--seconds 6] [--in-flight 8]
[--groups-per-lease 8] [--workdir var/bench-ingest] [--json PATH]``

It starts a private ``redis-server`` and its own daphne on free ports over a fresh SQLite database (migrated, one
job per record shape with 16 registered workers active in it, each with an agent key), then for each record shape
and each K drives K light agents (the agent protocol spoken directly with ``websockets``: hello, lease_request,
trajectories with pre-built groups; no model) for ``--seconds`` after a one-second warm-up. Shapes: ``demo``, the
demo job's records (arithmetic, n = 8, 2 completion tokens) and ``long``, 640-token completions (n = 8). A thread
keeps the prompt stream full and trims the trajectory stream (no learner runs). Reported per row: records/s
ingested (the replay buffer's ``accepted_records`` counter), records/s of raw pipelined XADD of the same stored
bytes on the same Redis, and the fraction. The agents' message rate limit is lifted (it is not what is measured).
Every process it started is stopped by pid at the end.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import websockets  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane import replay  # noqa: E402
from dataplane.groupcodec import encode_group  # noqa: E402
from dataplane.records import TrajectoryGroup  # noqa: E402
from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for  # noqa: E402

BIN = Path(sys.executable).parent
GROUP = 8
MAX_K = 16
SHAPES = {"demo": 2, "long": 640}  # shape -> completion tokens (and the job's max_new_tokens)

SETUP = """
import json
from decimal import Decimal
from django.contrib.auth.models import User
from dataplane.jobs import parse_job_spec
from marketplace import services
from marketplace.infra import stream
from marketplace.models import Activation, Job, Worker
owner = User.objects.create_user('owner', password='owner-pass')
provider = User.objects.create_user('provider', password='provider-pass')
out = {'jobs': {}, 'keys': {}}
for shape, tokens in SHAPES.items():
    spec = parse_job_spec({'name': f'ingest {shape}', 'model_dir': MODEL_DIR, 'task': {'name': 'arithmetic',
        'max_operand': 4}, 'batch_trajectories': 128, 'group_size': GROUP, 'max_new_tokens': tokens})
    job = services.job_create(owner=owner, spec=spec)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING)
    stream.replay(job.pk).ensure_groups()
    out['jobs'][shape], out['keys'][shape] = job.pk, []
    for i in range(MAX_K):
        worker, key = services.worker_register(user=provider, name=f'{shape}-{i}', gpu='bench',
                                               price_per_hour=Decimal('0.3'), bandwidth_bps=12_500_000)
        Activation.objects.create(job=job, worker=worker, price_per_hour=worker.price_per_hour)
        Worker.objects.filter(pk=worker.pk).update(status=Worker.Status.ACTIVE)
        out['keys'][shape].append(key)
print(json.dumps(out))
"""


def site_env(workdir: Path, redis_port: int) -> dict[str, str]:
    return dict(os.environ, DATABASE_URL=f"sqlite:///{workdir / 'site.sqlite3'}", DEBUG="true",
                REDIS_URL=f"redis://127.0.0.1:{redis_port}/0", ECHO2_DATA_DIR=str(workdir),
                DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1",
                PYTHONPATH=str(ROOT), ECHO2_AGENT_MESSAGES_PER_S="1000000", ECHO2_AGENT_MESSAGE_BURST="1000000",
                ECHO2_LEASE_TIMEOUT_S="60", ECHO2_CHECK_MODEL_DIR="false")


def start_stack(workdir: Path) -> tuple[Stack, int, int, dict]:
    """Redis, a migrated database with the jobs and workers, daphne; returns (stack, redis port, site port, setup)."""
    redis_port, site_port = free_port(), free_port()
    stack = Stack(workdir, site_env(workdir, redis_port))
    stack.start("redis", shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind",
                "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir))
    wait_for(lambda: redis.Redis(port=redis_port, socket_timeout=1).ping(), "Redis", 20)
    stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
    model_dir = workdir / "model"
    model_dir.mkdir(exist_ok=True)
    script = f"SHAPES = {SHAPES!r}\nGROUP = {GROUP}\nMAX_K = {MAX_K}\nMODEL_DIR = {str(model_dir)!r}\n" + SETUP
    setup = json.loads(stack.run(str(BIN / "python"), "manage.py", "shell", "-c", script).strip().splitlines()[-1])
    stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(site_port), *DAPHNE_WEBSOCKET_LIMITS,
                "echo2_site.asgi:application")
    import httpx

    wait_for(lambda: httpx.get(f"http://127.0.0.1:{site_port}/api/schema/", timeout=2).status_code == 200,
             "the site", 60)
    return stack, redis_port, site_port, setup


def group_template(job_id: int, tokens: int, rng: random.Random) -> tuple[dict, str]:
    """A group as an agent returns it (placeholders for the lease's ids and prompt) and its frame template."""
    ids = [rng.randrange(50_000) for _ in range(tokens)]
    logprobs = [-rng.random() * 5 for _ in range(tokens)]
    completion = "7" if tokens <= 2 else " ".join("tok" for _ in range(tokens))
    record = {"job_id": job_id, "lease_id": "@LEASE@", "group_id": "@GROUP@", "prompt": "@PROMPT@",
              "prompt_ids": [1, 5, 6, 7], "completion": completion, "completion_ids": ids, "logprobs": logprobs,
              "reward": 1.0, "version": 0, "loss_mask": None, "metadata": {}}
    group = {"job_id": job_id, "lease_id": "@LEASE@", "group_id": "@GROUP@", "version": 0, "records": [record] * GROUP}
    frame = json.dumps({"type": "trajectories", "group": group, "id": "@ID@"}, separators=(",", ":"))
    return group, frame


def fill(frame: str, lease: dict, request_id: str) -> str:
    prompt = json.dumps(lease["prompt"])[1:-1]
    return (frame.replace("@LEASE@", lease["lease_id"]).replace("@GROUP@", lease["group_id"])
            .replace("@PROMPT@", prompt).replace("@ID@", request_id))


async def agent(url: str, key: str, job_id: int, frame: str, stop: asyncio.Event, *, in_flight: int,
                per_lease: int) -> int:
    """One light agent: lease ``per_lease`` groups, send their groups with at most ``in_flight`` unanswered,
    lease again, until ``stop``; returns the records the site said it accepted."""
    async with websockets.connect(url, additional_headers={"Authorization": f"Bearer {key}"},
                                  max_size=None) as ws:
        await ws.send(json.dumps({"type": "hello", "agent_version": "bench"}))
        waiting: dict[str, asyncio.Future] = {}
        slots, accepted, ids = asyncio.Semaphore(in_flight), [0], iter(range(1, 1 << 62))

        async def read() -> None:
            async for text in ws:
                reply = json.loads(text)
                if reply.get("type") == "accepted":
                    accepted[0] += reply["accepted"]
                future = waiting.pop(reply.get("ref_id") or "", None)
                if future is not None:
                    future.set_result(reply)

        reader = asyncio.create_task(read())
        try:
            while not stop.is_set():
                rid = f"l{next(ids)}"
                waiting[rid] = asyncio.get_running_loop().create_future()
                await ws.send(json.dumps({"type": "lease_request", "job_id": job_id, "groups": per_lease, "id": rid}))
                reply = await waiting[rid]
                if reply["type"] != "lease":
                    await asyncio.sleep(0.05)
                    continue
                for lease in reply["leases"]:
                    await slots.acquire()
                    gid = f"g{next(ids)}"
                    waiting[gid] = future = asyncio.get_running_loop().create_future()
                    future.add_done_callback(lambda _f: slots.release())
                    await ws.send(fill(frame, lease, gid))
        finally:
            reader.cancel()
        return accepted[0]


def keep_fed(client: redis.Redis, job_id: int, stop: threading.Event) -> None:
    """Keep the prompt stream full and the trajectory stream short (no learner consumes it here)."""
    buffer = replay.ReplayBuffer(client, job_id)
    n = 0
    while not stop.is_set():
        if client.xlen(buffer.prompts) < 4000:
            buffer.add_prompts(f"{(n + i) % 5}+{(n + i) // 5 % 5}=" for i in range(4000))
            n += 4000
        client.xtrim(buffer.trajectories, maxlen=200, approximate=True)
        stop.wait(0.2)


async def drive(url: str, keys: list[str], job_id: int, frame: str, client: redis.Redis, args) -> float:
    """K agents for a warm-up second plus ``args.seconds``; returns the records/s the counters saw."""
    stop = asyncio.Event()
    tasks = [asyncio.create_task(agent(url, key, job_id, frame, stop, in_flight=args.in_flight,
                                       per_lease=args.groups_per_lease)) for key in keys]
    counters = replay.counters_key(job_id)
    await asyncio.sleep(1.0)
    c0, t0 = int(client.hget(counters, "accepted_records") or 0), time.monotonic()
    await asyncio.sleep(args.seconds)
    c1, t1 = int(client.hget(counters, "accepted_records") or 0), time.monotonic()
    stop.set()
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return (c1 - c0) / (t1 - t0)


def raw_xadd(client: redis.Redis, group: dict, seconds: float = 1.5) -> float:
    """Records/s of pipelined XADD (64 per round trip) of the bytes the site stores for one group (its columns,
    ``dataplane.groupcodec``)."""
    records = [{**rec, "lease_id": "1-1", "group_id": "g1", "prompt": "1+2="} for rec in group["records"]]
    data = encode_group(TrajectoryGroup.model_validate({**group, "lease_id": "1-1", "group_id": "g1",
                                                        "records": records}))
    fields = {"lease_id": "1-1", "worker_id": "1", "data": data}
    key, sent, start = "bench:ingest:raw", 0, time.monotonic()
    while time.monotonic() - start < seconds:
        pipe = client.pipeline(transaction=False)
        for _ in range(64):
            pipe.xadd(key, fields)
        pipe.execute()
        sent += 64
        client.xtrim(key, maxlen=200, approximate=True)
    elapsed = time.monotonic() - start
    client.delete(key)
    return sent * GROUP / elapsed


def run(args) -> list[dict]:
    workdir = Path(args.workdir).resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    stack, redis_port, site_port, setup = start_stack(workdir)
    client = redis.Redis(port=redis_port, decode_responses=True)
    rows = []
    try:
        for shape in args.shapes:
            job_id = setup["jobs"][shape]
            group, frame = group_template(job_id, SHAPES[shape], random.Random(0))
            stop = threading.Event()
            feeder = threading.Thread(target=keep_fed, args=(client, job_id, stop), daemon=True)
            feeder.start()
            try:
                for k in args.k:
                    rate = asyncio.run(drive(f"ws://127.0.0.1:{site_port}/ws/agent/", setup["keys"][shape][:k],
                                             job_id, frame, client, args))
                    raw = raw_xadd(client, group)
                    rows.append({"k": k, "shape": shape, "tokens": SHAPES[shape], "records_per_s": rate,
                                 "raw_xadd_records_per_s": raw, "fraction": rate / raw})
                    stack.check_alive()
            finally:
                stop.set()
                feeder.join()
    finally:
        client.close()
        stack.stop()
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, nargs="+", default=[1, 4, 16], help=f"Agents (at most {MAX_K}).")
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--seconds", type=float, default=6.0, help="Measured seconds per row (after 1 s warm-up).")
    parser.add_argument("--in-flight", type=int, default=8, help="Groups an agent sends before waiting for replies.")
    parser.add_argument("--groups-per-lease", type=int, default=8)
    parser.add_argument("--workdir", default=str(ROOT / "var" / "bench-ingest"))
    parser.add_argument("--json", help="Also write the rows here.")
    args = parser.parse_args(argv)
    if any(not 1 <= k <= MAX_K for k in args.k):
        parser.error(f"--k: between 1 and {MAX_K}")
    rows = run(args)
    table = Table(title=f"ingest over websockets ({os.cpu_count()} CPUs, in flight {args.in_flight}, "
                        f"{args.groups_per_lease} groups per lease, n = {GROUP})")
    for column in ("K", "record shape", "records/s ingested", "raw XADD records/s", "fraction"):
        table.add_column(column, justify="right")
    for row in rows:
        table.add_row(str(row["k"]), f"{row['shape']} ({row['tokens']} tokens)", f"{row['records_per_s']:,.0f}",
                      f"{row['raw_xadd_records_per_s']:,.0f}", f"{row['fraction']:.1%}")
    Console().print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Publication at fleet size, the part of ``bench_publication.py`` that runs the site: the learner's
``POST /api/jobs/<id>/snapshots/`` against N active workers, and the fan-out to N agent sockets.

What is real: the site's code (Django's test client through the API, authentication and ``snapshot_publish``),
a fresh database (SQLite, or with ``--database postgres`` one on the machine's PostgreSQL, dropped at the end;
migrated) holding the job, N workers and their activations, a private ``redis-server``
(started on a free port, stopped by pid at the end) carrying the chain plan and the channel layer
(``ResilientRedisChannelLayer``, the site's), and N channel-layer members of the job's agents group, each with
a real ``layer.receive`` loop (receiving again after each message, as a consumer does: what a group message costs
depends on every socket waiting again) and the site's own ``AgentConsumer.agent_snapshot`` handler, all in this one
process, as one daphne holds its sockets. What is not: the websocket itself (each consumer's ``send`` counts the
frame it would write) and the agents. Workers past ``--members-max`` are in the plan but have no socket here
(at 100 k: the request's time is measured at full size; the fan-out's per-worker cost on fewer sockets).

Per row: the learner's request time (client to reply), the time until every member has its message, the site's
CPU (this process: request and fan-out) per worker, the Redis bytes of the fan-out (the event as channels_redis
queues it, with its member list, and the announcement record; beside them the chain plan, stored as before) and
what the old way queued (one message per worker, each with the manifest inline, scaled to N), and the figures
measured before (one channel-layer send per worker inside the request).

And the bytes of one worker's message: as sent now, the manifest by reference (the mean frame the sockets were
handed), and the same messages with the manifest inline, as the site sent them before (each sampled frame with
its reference replaced by the manifest's JSON); the socket bytes of one publication both ways (N x the message);
and what the learner sends instead, once per version: to each chain's head in its relay hub's ``accept`` and to
each worker left out of the chains over HTTP, (seeds + HTTP workers) x the manifest, as the plan has them; every
other worker takes it from its chain parent. Beside it, N x ``manifest.json``: what the learner's server sent when
every worker fetched it (2026-12-06, before the manifest went down the chains).
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import random
import shutil
import socket
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from types import SimpleNamespace

BEFORE = {1_000: "2.1-2.8", 10_000: "25-29", 100_000: "~240-300 (extrapolated)"}  # per-worker sends, end to end, s
REQUEST_TARGET_S, NOTIFIED_TARGET_S, TARGET_N = 1.0, 5.0, 10_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                             "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    import redis

    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            break
        except redis.ConnectionError:
            time.sleep(0.05)
    client.close()
    return proc, f"redis://127.0.0.1:{port}/0"


PG_ADMIN_URL = "postgres://postgres@127.0.0.1:5432/postgres"


class Postgres:
    """A fresh database on the machine's PostgreSQL (``--database postgres``), dropped at the end."""

    def __init__(self) -> None:
        self.name = f"echo2_bench_publication_{os.getpid()}"
        self.url = PG_ADMIN_URL.rpartition("/")[0] + "/" + self.name

    def _run(self, sql: str) -> None:
        import psycopg

        with psycopg.connect(PG_ADMIN_URL, autocommit=True, connect_timeout=10) as conn:
            conn.execute(sql)

    def create(self) -> str:
        self._run(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        self._run(f'CREATE DATABASE "{self.name}"')
        return self.url

    def drop(self) -> None:
        from django.db import connections

        connections.close_all()
        self._run(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')


def setup_django(workdir: Path, redis_url: str, database_url: str) -> None:
    os.environ.update(DJANGO_SETTINGS_MODULE="echo2_site.settings", DATABASE_URL=database_url,
                      REDIS_URL=redis_url, DEBUG="false", SECRET_KEY="bench-publication", SECURE_SSL_REDIRECT="false",
                      ECHO2_DATA_DIR=str(workdir), ECHO2_THROTTLE_USER="100000/s",
                      ECHO2_CHANNEL_PREFIX="benchlayer")
    import django
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)


def make_fleet(n: int, *, no_relay: float, seed: int = 0):
    """A running chain job with ``n`` active workers (``no_relay`` of them without a relay address), its owner's
    API token and the workers' ids."""
    from decimal import Decimal

    from django.contrib.auth.models import User
    from django.utils import timezone

    from dataplane.jobs import parse_job_spec
    from marketplace import services
    from marketplace.models import Activation, Job, Provider, Worker

    rng, tag = random.Random(seed), f"{n}-{User.objects.count()}"
    owner = User.objects.create_user(f"owner{tag}")
    model_dir = Path(tempfile.mkdtemp(prefix="model-", dir=os.environ["ECHO2_DATA_DIR"]))
    (model_dir / "config.json").touch()
    spec = parse_job_spec({"name": f"fleet {n}", "model_dir": str(model_dir), "task": {"name": "arithmetic"},
                           "learner_uplink_bps": 1_000_000_000 * max(1, n // 1000)})
    job = services.job_create(owner=owner, spec=spec)
    Job.objects.filter(pk=job.pk).update(status=Job.Status.RUNNING, started_at=timezone.now(),
                                         learner_relay="10.255.0.1:7000")
    provider = Provider.objects.create(user=User.objects.create_user(f"provider{tag}"), display_name="fleet")
    now = timezone.now()
    workers = [Worker(provider=provider, name=f"w{i}", gpu="g", price_per_hour=Decimal("0.1"),
                      bandwidth_bps=rng.randrange(10_000_000, 100_000_000), key_hash=f"bench-{tag}-{i}",
                      relay_address="" if i < n * no_relay else f"10.{i >> 16}.{(i >> 8) & 255}.{i & 255}:7001",
                      status=Worker.Status.ACTIVE, last_heartbeat=now) for i in range(n)]
    Worker.objects.bulk_create(workers, batch_size=2000)
    ids = list(Worker.objects.filter(provider=provider).values_list("pk", flat=True))
    Activation.objects.bulk_create([Activation(job_id=job.pk, worker_id=w, price_per_hour=Decimal("0.1"))
                                    for w in ids], batch_size=2000)
    return Job.objects.get(pk=job.pk), services.api_token_issue(user=owner, replace=False), ids


class Sockets:
    """What the members' consumers would have written to their websockets."""

    def __init__(self, expected: int) -> None:
        self.expected, self.count, self.bytes, self.last = expected, 0, 0, 0.0
        self.samples: dict[int, str] = {}  # a few workers' frames (route, credential and reference included)
        self.done = asyncio.Event()

    def sink_for(self, worker_id: int):
        async def send(message: dict) -> None:
            self.count += 1
            self.bytes += len(message["text"].encode())
            if len(self.samples) < 16:
                self.samples[worker_id] = message["text"]
            if self.count >= self.expected:
                self.last = time.perf_counter()
                self.done.set()
        return send


async def join_members(layer, job_id: int, member_ids: list[int], sockets: Sockets, *,
                       rejoin_all: bool = False) -> list[asyncio.Task]:
    """One channel-layer member per worker in the job's agents group, receiving as a consumer does: each joined just
    now, or (``rejoin_all``) each with its membership due for its re-join at this event (``JobFollower.stay``), the
    worst case, which a live site meets only if a whole fleet joined at once an hour before."""
    from dataplane import messages as m
    from marketplace.realtime.consumers import AgentConsumer
    from marketplace.realtime.jobcache import FreshFor
    from marketplace.services import fanout

    group = fanout.agents_group(job_id)

    async def member(worker_id: int) -> None:
        channel = await layer.new_channel()
        consumer = AgentConsumer()
        consumer.worker, consumer.channel_layer, consumer.channel_name = SimpleNamespace(pk=worker_id), layer, channel
        consumer.running, consumer.base_send = FreshFor(60.0), sockets.sink_for(worker_id)
        # a socket whose hello was answered (pushes handled where they arrive), as ``connect`` and the hello leave it
        consumer.welcomed, consumer.following = m.Welcome.model_construct(), asyncio.Lock()
        consumer.follower = fanout.JobFollower(layer, channel, worker_id)
        await layer.group_add(group, channel)
        consumer.follower.group = group
        consumer.follower.joined_at = -math.inf if rejoin_all else time.monotonic()
        joined.release()
        while True:  # as Channels' consumer does: each message handled, then the next receive (until cancelled)
            event = await layer.receive(channel)
            await getattr(consumer, event["type"].replace(".", "_"))(event)

    joined = asyncio.Semaphore(0)
    tasks = []
    for start in range(0, len(member_ids), 500):  # joins 500 at a time: the Redis connection pool's size
        batch = member_ids[start:start + 500]
        tasks += [asyncio.create_task(member(w)) for w in batch]
        for _ in batch:
            await joined.acquire()
    return tasks


def inline_bytes(text: str, manifest: dict) -> int:
    """The bytes of the frame ``text`` with its manifest inline instead of by reference: what the site sent before
    (the message's JSON with ``"manifest": {...}``, compact, in place of ``manifest_sha256`` and
    ``manifest_bytes``)."""
    message = json.loads(text)
    inline = {("manifest" if key == "manifest_sha256" else key): (manifest if key == "manifest_sha256" else value)
              for key, value in message.items() if key != "manifest_bytes"}
    return len(json.dumps(inline, separators=(",", ":")).encode())


def redis_bytes(layer, client, job_id: int, version: int, event: dict) -> tuple[int, int]:
    """(fan-out bytes: the event as queued with its member list + the announcement record, the chain plan's)."""
    from marketplace.services import fanout

    names = [x.decode() for x in client.zrange(layer._group_key(fanout.agents_group(job_id)), 0, -1)]
    _, queued, _ = layer._map_channel_keys_to_connection(names, event)
    record = client.strlen(f"echo2:bcast:{job_id}:{version}:announced") + client.strlen(f"echo2:bcast:{job_id}:latest")
    return sum(len(v) for v in queued.values()) + record, client.strlen(f"echo2:bcast:{job_id}:{version}")


async def one_size(n: int, *, no_relay: float, members_max: int, manifest: dict, redis_url: str,
                   rejoin_all: bool = False) -> dict:
    import redis
    from asgiref.sync import sync_to_async
    from channels.layers import get_channel_layer
    from django.test import Client

    from dataplane import credentials
    from dataplane.snapshot import parse_manifest
    from marketplace.infra import telemetry
    from marketplace.services import fanout

    job, token, ids = await sync_to_async(make_fleet, thread_sensitive=True)(n, no_relay=no_relay)
    members = ids if len(ids) <= members_max else sorted(random.Random(1).sample(ids, members_max))
    layer = get_channel_layer()
    sockets = Sockets(len(members))
    tasks = await join_members(layer, job.pk, members, sockets, rejoin_all=rejoin_all)
    body = json.dumps({"version": 1, "url": "http://learner.example.net:9000/v1/",
                       "manifest": {**manifest, "job_id": job.pk}})
    client = Client(HTTP_AUTHORIZATION=f"Token {token}")

    def post() -> tuple[float, float, int, bytes]:
        started, cpu = time.perf_counter(), time.thread_time()
        reply = client.post(f"/api/jobs/{job.pk}/snapshots/", data=body, content_type="application/json")
        return time.perf_counter() - started, time.thread_time() - cpu, reply.status_code, reply.content[:300]

    await sync_to_async(client.get, thread_sensitive=False)(f"/api/jobs/{job.pk}/snapshots/")  # warm: imports, URLs
    loads = fanout.PUBLICATIONS.loads
    cpu0, t0 = time.process_time(), time.perf_counter()
    request_s, request_cpu, status, content = await sync_to_async(post, thread_sensitive=False)()
    assert status == 201, f"publish refused: HTTP {status}: {content!r}"
    # a socket's handler that raised fails the run at once (it would leave the count short, and the wait to time out)
    everyone = asyncio.ensure_future(sockets.done.wait())
    ended, _ = await asyncio.wait([everyone, *tasks], timeout=600, return_when=asyncio.FIRST_COMPLETED)
    cpu = time.process_time() - cpu0
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    if everyone not in ended:
        everyone.cancel()
        failed = [t for t in ended if t is not everyone]
        raise failed[0].exception() if failed else TimeoutError(f"{sockets.count} of {len(members)} sockets "
                                                                  "notified within 600 s")
    rclient = redis.Redis.from_url(redis_url)
    nonce = fanout.latest_announced(job.pk)[1]
    event = {"type": fanout.EVENT, "job_id": job.pk, "version": 1, "nonce": nonce}
    fanout_bytes, plan_bytes = redis_bytes(layer, rclient, job.pk, 1, event)
    stored = parse_manifest({**manifest, "job_id": job.pk}).model_dump(mode="json")  # as the site keeps it
    for worker_id, text in sockets.samples.items():  # each its own credential
        sent = json.loads(text)
        credentials.verify(job.transfer_secret, sent["credential"], job_id=job.pk, version=1, now=time.time(),
                           worker_id=worker_id)
    message = sockets.bytes / sockets.count
    grew = statistics.mean(inline_bytes(t, stored) - len(t.encode()) for t in sockets.samples.values())
    served = len(parse_manifest(stored).model_dump_json().encode())  # the learner's manifest.json (store.py)
    plan = telemetry.load_chain_plan(job.pk, 1)  # who asks the learner for the manifest: heads and HTTP workers
    seeds, http = len(plan.chains), n - sum(len(chain) for chain in plan.chains)
    await layer.flush()
    rclient.close()
    return {"n": n, "members": len(members), "request_s": request_s, "notified_s": sockets.last - t0,
            # the request's CPU spread over every worker, the rest (the fan-out) over the sockets that took it
            "cpu_us": 1e6 * (request_cpu / n + (cpu - request_cpu) / len(members)),
            "fanout_bytes": fanout_bytes, "plan_bytes": plan_bytes, "old_bytes": (message + grew) * n,
            "message_bytes": message, "inline_bytes": message + grew, "manifest_bytes": served,
            "seeds": seeds, "http_workers": http,
            "reads": fanout.PUBLICATIONS.loads - loads}


def run(sizes: list[int], *, no_relay: float, members_max: int, chunks: int, repeat: int = 3,
        database: str = "sqlite", rejoin_all: bool = False) -> tuple[list[dict], bool]:
    """Every size on one fresh stack, ``repeat`` times up to ``TARGET_N`` workers (once above: minutes); one row
    per size, medians and worsts of its runs, and whether the medians meet the targets at ``TARGET_N``."""
    from dataplane.snapshot import build_manifest

    workdir = Path(tempfile.mkdtemp(prefix="bench-publication-"))
    proc, redis_url = start_redis(workdir)
    postgres = Postgres() if database == "postgres" else None
    try:
        setup_django(workdir, redis_url, postgres.create() if postgres else f"sqlite:///{workdir / 'site.db'}")
        manifest = build_manifest(bytes(chunks * 1024), job_id=1, version=1, chunk_bytes=1024).model_dump(mode="json")
        rows = []
        for n in sizes:
            runs = [asyncio.run(one_size(n, no_relay=no_relay, members_max=members_max, manifest=manifest,
                                         redis_url=redis_url, rejoin_all=rejoin_all))
                    for _ in range(repeat if n <= TARGET_N else 1)]
            rows.append(_summary(runs))
    finally:
        if postgres is not None:
            postgres.drop()
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)
    ok = all(r["request_s"] < REQUEST_TARGET_S and r["notified_s"] < NOTIFIED_TARGET_S
             for r in rows if r["n"] == TARGET_N)
    return rows, ok


def _summary(runs: list[dict]) -> dict:
    """Medians of the runs of one size, with the worst request and notification times."""
    row = {key: statistics.median(r[key] for r in runs) for key in runs[0]}
    row.update(runs=len(runs), request_max=max(r["request_s"] for r in runs),
               notified_max=max(r["notified_s"] for r in runs))
    return row


def table(rows: list[dict], *, chunks: int, rejoin_all: bool = False):
    from rich.table import Table

    out = Table(title=f"Publication to N active workers: the learner's request and the fan-out (manifest of "
                      f"{chunks} chunks; targets at 10 k: request < {REQUEST_TARGET_S:g} s, all notified "
                      f"< {NOTIFIED_TARGET_S:g} s; medians of the runs, worst after the slash"
                      + ("; every membership due for its re-join)" if rejoin_all else ")"))
    for col in ("workers", "sockets here", "runs", "learner's request s", "all notified s", "before (issue 25) s",
                "site CPU / worker us", "Redis: fan-out", "Redis: plan", "Redis: old way", "reads / process"):
        out.add_column(col, justify="right")
    for r in rows:
        out.add_row(f"{r['n']:,}", f"{r['members']:,}", str(r["runs"]),
                    f"{r['request_s']:.2f} / {r['request_max']:.2f}",
                    f"{r['notified_s']:.2f} / {r['notified_max']:.2f}",
                    BEFORE.get(r["n"], "-"), f"{r['cpu_us']:.0f}", _size(r["fanout_bytes"]),
                    _size(r["plan_bytes"]), _size(r["old_bytes"]), f"{r['reads']:g}")
    return out


def message_table(rows: list[dict], *, chunks: int):
    """One worker's ``snapshot`` message, the manifest inline (before) and by reference (now), and what a
    publication sends down the sockets either way; beside them what the learner's server sends instead."""
    from rich.table import Table

    out = Table(title=f"A publication's message per worker (manifest of {chunks} chunks): inline, as before, against "
                      "by reference; what the learner sends instead: the manifest to each chain head (its relay "
                      "hub's accept) and each worker out of the chains (HTTP); the others take it from their chain "
                      "parent. Before that, every worker fetched it from the learner: N x manifest")
    for col in ("workers", "message inline B", "message by reference B", "ratio", "sockets inline",
                "sockets by reference", "learner: manifest B", "heads + HTTP workers", "learner sends",
                "before: N x manifest"):
        out.add_column(col, justify="right")
    for r in rows:
        asks = r["seeds"] + r["http_workers"]
        out.add_row(f"{r['n']:,}", f"{r['inline_bytes']:,.0f}", f"{r['message_bytes']:,.0f}",
                    f"{r['inline_bytes'] / r['message_bytes']:.0f}x", _size(r["inline_bytes"] * r["n"]),
                    _size(r["message_bytes"] * r["n"]), f"{r['manifest_bytes']:,}",
                    f"{r['seeds']:,.0f} + {r['http_workers']:,.0f}", _size(r["manifest_bytes"] * asks),
                    _size(r["manifest_bytes"] * r["n"]))
    return out


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1024 or unit == "GB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)

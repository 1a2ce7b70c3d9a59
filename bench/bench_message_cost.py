"""What one agent message costs the site on the steady path: CPU, SQL statements and Redis round trips per message.

Run: ``.venv/bin/python bench/bench_message_cost.py [--messages 200] [--groups 2] [--group-size 8] [--tokens 16]``
(about a minute; from another checkout: ``cd CHECKOUT && /path/to/.venv/bin/python bench/bench_message_cost.py``).
``--only heartbeat submit`` measures those rows alone; ``--profile submit --profile-out F`` writes a cProfile of that
row's block (read it with ``python -m pstats F``; the profiler's own cost inflates the row's CPU figure).

In one process, over the real agent consumer (Channels' communicator: the site's own code from the frame's text to
the reply's, no network), a fresh PostgreSQL database (``ECHO2_BENCH_PG_URL``'s server; dropped at the end) and a
private ``redis-server``: one worker says hello, is activated in a running job and then, one block per row, sends
``--messages`` messages of one kind in a row, each answered before the next is sent:

- *heartbeat*: a generating agent's heartbeat that stays in Redis, each written before the next is sent (as an
  agent's come, one every 2 s: a socket's heartbeats sent back to back are written together, one waiting replaced);
- *heartbeat, report due*: one whose periodic report is due (a worker in a job's is every ``HEARTBEAT_DB_SYNC_S``,
  10 s: one in five of its heartbeats at the 2 s interval), each finding its report period run out, after a billing
  fold (``activations_release_silent``, every expiry beat) billed the worker, as one does every 10 s;
- *submit*: ``--groups`` answered groups of ``--group-size`` records of ``--tokens`` tokens and a lease of as many;
- *install report*: every worker of a job reports each version it installs; ``--messages`` versions published and
  pushed to the socket before the block (not counted), then one report per version;
- *lease request, job read again*: ``--sockets`` more workers' sockets each ask for a lease once their held job
  expired, as it does every ``AGENT_STATE_MAX_AGE_S`` (2 s): what reading it again costs per socket;
- *install report + lease request, at once*: the ``1 + --sockets`` sockets each report a version's install at once,
  as a fleet does at every publication, and ask for a lease after it (answered once the report is written), over
  ``--publications`` versions: as the site writes them (the reports that arrive while a batch is written go in the
  next) and, beside it, one report per transaction (what the site did before);
- *heartbeat, at once*: the ``1 + --sockets`` sockets each send a heartbeat at once, ``--publications`` rounds: as the
  site writes them (those that arrive together in one Redis round trip) and one round trip each;
- *billing fold*: the fold over the job's ``1 + --sockets`` workers, all generating (installed, a lease held) and
  last billed 10 s before, as the fold finds them every 10 s: per worker (``--folds`` folds).

A heartbeat has no reply: each block ends with one lease request, whose reply says the socket has handled everything
before it (frames of one socket are handled in order); its cost is in the block. Per message: CPU (``process_time``:
every thread of the process, the frames' building left out), SQL statements (a wrapper on every connection) and
round trips on the streams' Redis clients (the threads' and the event loop's). CPU time, unlike wall time, barely
moves with the machine's load; the load average is printed beside it.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from echo2_site.demo import free_port, wait_for  # noqa: E402

ROW_KINDS = ("heartbeat", "submit", "install", "lease", "at-once", "fold")
PG_ADMIN_URL = os.environ.get("ECHO2_BENCH_PG_URL", "postgres://postgres@127.0.0.1:5432/postgres")


class Counters:
    """SQL statements on every database connection and round trips on the streams' Redis clients, from now on."""

    def __init__(self) -> None:
        self.sql = self.redis = 0

    def install(self) -> None:
        from django.db.backends.signals import connection_created

        from marketplace.infra import stream

        def counted(execute, sql, params, many, context):
            self.sql += 1
            return execute(sql, params, many, context)

        def wrap(sender, connection, **kwargs) -> None:
            if counted not in connection.execute_wrappers:  # a wrapper outlives its connection: once per wrapper
                connection.execute_wrappers.append(counted)

        connection_created.connect(wrap, weak=False)
        pool = stream.client().connection_pool
        counters = self

        class Counting(pool.connection_class):
            def send_packed_command(self, command, check_health=True):
                counters.redis += 1
                return super().send_packed_command(command, check_health)

        pool.connection_class = Counting
        pool.disconnect()

        class CountingAsync:
            async def send_packed_command(self, command, check_health=True):
                counters.redis += 1
                return await super().send_packed_command(command, check_health)

        made = stream.async_client  # the event loop's own client (heartbeats): counted the same way, once made

        def counted_async_client(*args, **kwargs):
            client = made(*args, **kwargs)
            pool = client.connection_pool
            if not issubclass(pool.connection_class, CountingAsync):
                pool.connection_class = type("Counting", (CountingAsync, pool.connection_class), {})
            return client

        stream.async_client = counted_async_client


class BeatsWritten:
    """The heartbeats the site wrote to Redis, counted while in use (``services.worker_heartbeats_record_async``
    wrapped): a block waits for its heartbeats to be written before it sends the next."""

    def __init__(self) -> None:
        self.n = 0
        self._wrote = asyncio.Condition()
        self._real = None

    def __enter__(self) -> BeatsWritten:
        from marketplace import services

        self._real = services.worker_heartbeats_record_async
        services.worker_heartbeats_record_async = self._counted
        return self

    def __exit__(self, *exc) -> None:
        from marketplace import services

        services.worker_heartbeats_record_async = self._real

    async def _counted(self, beats):
        out = await self._real(beats)
        self.n += len(beats)
        async with self._wrote:
            self._wrote.notify_all()
        return out

    async def until(self, n: int) -> None:
        """Return once ``n`` heartbeats were written (60 s at most)."""
        async with self._wrote:
            await asyncio.wait_for(self._wrote.wait_for(lambda: self.n >= n), timeout=60)


def setup_site(workdir: Path, redis_port: int, db_url: str) -> None:
    os.environ.update(DATABASE_URL=db_url, REDIS_URL=f"redis://127.0.0.1:{redis_port}/0",
                      ECHO2_CACHE_URL=f"redis://127.0.0.1:{redis_port}/1", ECHO2_DATA_DIR=str(workdir),
                      DJANGO_SETTINGS_MODULE="echo2_site.settings", DEBUG="false", SECRET_KEY="bench-not-secret",
                      SECURE_SSL_REDIRECT="false", LOG_LEVEL="WARNING", ECHO2_DB_POOL_MAX="0",
                      ECHO2_AGENT_MESSAGES_PER_S="100000", ECHO2_AGENT_MESSAGE_BURST="100000",  # not what is measured
                      CELERY_TASK_ALWAYS_EAGER="true")  # the job's start provisions at once, as in the tests
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)


async def run(args, counters: Counters) -> list[dict]:
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.contrib.auth.models import User

    from dataplane import messages as m
    from dataplane.jobs import parse_job_spec
    from dataplane.records import Trajectory, TrajectoryGroup
    from dataplane.tasks import build_task
    from learner.prompts import PromptFeeder
    from marketplace import services
    from marketplace.infra import liveness, stream
    from marketplace.models import Job
    from marketplace.realtime.consumers import AgentConsumer
    from marketplace.services import presence

    model_dir = Path(tempfile.mkdtemp(prefix="echo2-bench-model-"))
    (model_dir / "config.json").write_text("{}")

    def make():
        owner = User.objects.create_user("owner", password="pw-12345678")
        provider = User.objects.create_user("provider", password="pw-12345678")
        worker, key = services.worker_register(user=provider, name="rig", gpu="bench", price_per_hour="0.30",
                                               bandwidth_bps=12_500_000)
        spec = parse_job_spec({"name": "bench", "model_dir": str(model_dir), "task": {"name": "arithmetic"},
                               "batch_trajectories": 8 * args.groups * args.group_size,
                               "group_size": args.group_size, "max_new_tokens": args.tokens})
        return services.job_create(owner=owner, spec=spec), worker, key

    job, worker, key = await database_sync_to_async(make)()
    comm = WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agent/",
                                 headers=[(b"authorization", f"Bearer {key}".encode())])
    assert (await comm.connect())[0]
    await comm.send_json_to({"type": "hello", "agent_version": "bench"})
    assert (await comm.receive_json_from(timeout=30))["type"] == "welcome"
    await database_sync_to_async(lambda: services.job_start(job=Job.objects.get(pk=job.pk)))()
    while (await comm.receive_json_from(timeout=30))["type"] != "assign":
        pass
    feeder = PromptFeeder(stream.client(), job_id=job.pk, task=build_task({"name": "arithmetic"}), seed=0,
                          backlog=4 * args.groups * (args.messages + 10))
    feeder.top_up()
    sequence = iter(range(10**9))

    async def ask(frame: str) -> dict:
        await comm.send_to(text_data=frame)
        while True:
            reply = await comm.receive_json_from(timeout=60)
            if reply["type"] not in ("snapshot", "welcome"):
                return reply

    def lease_frame() -> str:
        return m.LeaseRequest(id=f"r{next(sequence)}", job_id=job.pk, groups=args.groups).model_dump_json()

    def submit_frame(leases: list[dict]) -> str:
        groups = [TrajectoryGroup.of([Trajectory(
            job_id=job.pk, lease_id=x["lease_id"], group_id=x["group_id"], prompt=x["prompt"], prompt_ids=[1, 2, 3],
            completion="7" * args.tokens, completion_ids=[12] * args.tokens, logprobs=[-0.5] * args.tokens,
            reward=float(i % 2), version=0) for i in range(args.group_size)]) for x in leases]
        return m.Submit(id=f"r{next(sequence)}", job_id=job.pk, groups=groups, lease=args.groups).model_dump_json()

    leases = (await ask(lease_frame()))["leases"]
    for _ in range(5):  # warm: scripts loaded, connections open, the job read
        leases = (await ask(submit_frame(leases)))["lease"]["leases"]

    async def block(name: str, n: int, one, finish=None) -> dict:
        profile = cProfile.Profile() if args.profile == name else None
        cpu0, sql0, redis0, harness = time.process_time(), counters.sql, counters.redis, 0.0
        if profile is not None:
            profile.enable()
        for _ in range(n):
            harness += await one()
        if finish is not None:
            await finish()
        if profile is not None:
            profile.disable()
            profile.dump_stats(args.profile_out)
        cpu = time.process_time() - cpu0 - harness
        return {"message": name, "n": n, "cpu_ms": 1000 * cpu / n, "sql": (counters.sql - sql0) / n,
                "redis": (counters.redis - redis0) / n}

    async def heartbeats(due: bool) -> dict:
        """Each heartbeat written to Redis before the next is sent, as an agent's come (one every 2 s): a socket's
        heartbeats sent back to back would be written together, and one waiting replaced by a newer."""
        beat = json.dumps({"type": "heartbeat", "throughput": 1.0, "state": "generating", "job_id": job.pk})
        written = BeatsWritten()

        async def one() -> float:
            target = written.n + 1
            await comm.send_to(text_data=beat)
            await written.until(target)
            return 0.0

        real = liveness._sync_key
        if due:  # each finds its report period run out (a key never set), as one in five does
            fresh = itertools.count()
            liveness._sync_key = lambda worker_id: f"echo2:bench:synced:{worker_id}:{next(fresh)}"
            await database_sync_to_async(presence.activations_release_silent)()  # what every expiry beat runs

        try:  # every heartbeat's report (in the socket's lane) is in once the lease request after them is answered
            with written:
                return await block("heartbeat, report due" if due else "heartbeat", args.messages, one,
                                   finish=lambda: ask(lease_frame()))
        finally:
            liveness._sync_key = real

    async def submits() -> dict:
        async def one() -> float:
            nonlocal leases
            started = time.process_time()
            frame = submit_frame(leases)
            built = time.process_time() - started
            leases = (await ask(frame))["lease"]["leases"]
            return built

        return await block("submit", args.messages, one)

    async def installs() -> dict:
        """One install report per version, each of a version published before the block and pushed to the socket
        (not counted), as every worker of a job sends one at every publication."""
        from dataplane.snapshot import build_manifest

        def publish() -> int:
            first = Job.objects.get(pk=job.pk).published_version + 1
            for version in range(first, first + args.messages):
                manifest = build_manifest(bytes(16), job_id=job.pk, version=version).model_dump(mode="json")
                services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version,
                                          url=f"http://bench/v{version}/", manifest=manifest)
            return first

        first = await database_sync_to_async(publish)()
        last = first + args.messages - 1
        while True:  # every publication's push handled by the socket before the block
            pushed = await comm.receive_json_from(timeout=60)
            if pushed["type"] == "snapshot" and pushed["version"] == last:
                break
        versions = iter(range(first, 10**9))

        async def one() -> float:
            await comm.send_to(text_data=json.dumps({"type": "snapshot_installed", "job_id": job.pk,
                                                     "version": next(versions), "seconds": 0.5}))
            return 0.0

        return await block("install report", args.messages, one,
                           finish=lambda: ask(lease_frame()))

    rows = []
    if "heartbeat" in args.only:
        await heartbeats(False)  # the state the heartbeats report is now recorded: the next stay in Redis
        rows += [await heartbeats(False), await heartbeats(True)]
    if "submit" in args.only:
        rows.append(await submits())
    if "install" in args.only:
        rows.append(await installs())
    sockets = []
    if {"lease", "at-once", "fold"} & set(args.only):
        sockets = await expired(args, counters, job, key, rows)
    if "at-once" in args.only:
        for together in (True, False):
            rows.append(await installs_at_once(args, counters, job, [comm, *sockets], together=together))
        for together in (True, False):
            rows.append(await heartbeats_at_once(args, counters, job, [comm, *sockets], together=together))
    if "fold" in args.only:
        rows.append(await folds(args, counters, job))  # while the sockets of every worker are open
    for other in (comm, *sockets):
        await other.disconnect()
    shutil.rmtree(model_dir, ignore_errors=True)
    return rows


async def expired(args, counters: Counters, job, key: str, rows: list[dict]) -> list:
    """``--sockets`` more workers' sockets in the job, each holding it; once their hold expired, each asks for a
    lease: the job's reads per socket are what a fleet pays every ``AGENT_STATE_MAX_AGE_S``. Adds the rows to
    ``rows``; returns the sockets, open."""
    from channels.db import database_sync_to_async
    from channels.testing import WebsocketCommunicator
    from django.conf import settings
    from django.contrib.auth.models import User

    from marketplace import services
    from marketplace.models import Job
    from marketplace.realtime.consumers import AgentConsumer

    def register() -> list[str]:
        provider = User.objects.create_user("provider2", password="pw-12345678")
        return [services.worker_register(user=provider, name=f"rig{i}", gpu="bench", price_per_hour="0.30",
                                         bandwidth_bps=12_500_000)[1] for i in range(args.sockets)]

    keys = await database_sync_to_async(register)()
    comms = []
    for agent_key in keys:
        comm = WebsocketCommunicator(AgentConsumer.as_asgi(), "/ws/agent/",
                                     headers=[(b"authorization", f"Bearer {agent_key}".encode())])
        assert (await comm.connect())[0]
        await comm.send_json_to({"type": "hello", "agent_version": "bench"})
        assert (await comm.receive_json_from(timeout=30))["type"] == "welcome"
        comms.append(comm)
    await database_sync_to_async(services.job_activate_idle_workers)(job=await database_sync_to_async(
        Job.objects.get)(pk=job.pk))
    lease = json.dumps({"type": "lease_request", "job_id": job.pk, "groups": 1})

    async def round_of_leases() -> int:
        answered = 0
        for comm in comms:
            await comm.send_to(text_data=lease)
        for comm in comms:
            while True:
                reply = await comm.receive_json_from(timeout=60)
                if reply["type"] in ("lease", "no_work", "rejected"):
                    answered += reply["type"] != "rejected"
                    break
        return answered

    for _ in range(3):  # the assignments pushed and taken, their snapshots sent, every socket holding the job
        await round_of_leases()
        await asyncio.sleep(settings.ECHO2["AGENT_STATE_MAX_AGE_S"] + 0.05)  # and then every socket's hold expired
    for held in (False, True):  # each socket's hold ran out; then, at once again, still held
        cpu0, sql0, redis0 = time.process_time(), counters.sql, counters.redis
        answered = await round_of_leases()
        cpu, n = time.process_time() - cpu0, len(comms)
        rows.append({"message": f"lease request, {'job held' if held else 'job read again'} ({n} sockets, {answered} "
                                "served)", "n": n, "cpu_ms": 1000 * cpu / n, "sql": (counters.sql - sql0) / n,
                     "redis": (counters.redis - redis0) / n})
    return comms


async def installs_at_once(args, counters: Counters, job, comms: list, *, together: bool) -> dict:
    """Every socket of the job reports its install of a version at once, as a fleet does at each publication, then
    asks for a lease (answered once its report is written): per report with its lease request, over
    ``--publications`` versions. ``together``: as the site writes them (the reports that arrive while one batch is
    written go in the next); else one report per transaction (``GroupCommit`` with ``max_items=1``), as before."""
    from channels.db import database_sync_to_async

    from dataplane.snapshot import build_manifest
    from marketplace import services
    from marketplace.models import Job
    from marketplace.realtime import consumers
    from marketplace.realtime.batches import GroupCommit

    def publish() -> int:
        version = Job.objects.get(pk=job.pk).published_version + 1
        manifest = build_manifest(bytes(16), job_id=job.pk, version=version).model_dump(mode="json")
        services.snapshot_publish(job=Job.objects.get(pk=job.pk), version=version, url=f"http://bench/v{version}/",
                                  manifest=manifest)
        return version

    async def pushed(comm, version: int) -> None:
        while (reply := await comm.receive_json_from(timeout=60))["type"] != "snapshot" or reply["version"] < version:
            pass

    lease = json.dumps({"type": "lease_request", "job_id": job.pk, "groups": 1})
    real = consumers.INSTALLS
    if not together:
        consumers.INSTALLS = GroupCommit(real.write, max_items=1)
    cpu, sql, redis, n = 0.0, 0, 0, 0
    try:
        for _ in range(args.publications):
            version = await database_sync_to_async(publish)()
            for comm in comms:  # every push taken before the reports: not counted
                await pushed(comm, version)
            cpu0, sql0, redis0 = time.process_time(), counters.sql, counters.redis
            report = json.dumps({"type": "snapshot_installed", "job_id": job.pk, "version": version, "seconds": 0.5})
            for comm in comms:
                await comm.send_to(text_data=report)
                await comm.send_to(text_data=lease)
            for comm in comms:
                while (await comm.receive_json_from(timeout=60))["type"] not in ("lease", "no_work", "rejected"):
                    pass
            cpu += time.process_time() - cpu0
            sql, redis, n = sql + counters.sql - sql0, redis + counters.redis - redis0, n + len(comms)
    finally:
        consumers.INSTALLS = real
    how = "written together" if together else "one per transaction"
    return {"message": f"install report + lease request, {len(comms)} sockets at once, {how}", "n": n,
            "cpu_ms": 1000 * cpu / n, "sql": sql / n, "redis": redis / n}


async def heartbeats_at_once(args, counters: Counters, job, comms: list, *, together: bool) -> dict:
    """Every socket of the job sends a heartbeat at once, as a fleet's do all the time (each every 2 s), and the next
    round goes once all are written: per heartbeat, over ``--publications`` rounds (after one not counted: the
    state they report is recorded). ``together``: as the site writes them (those that arrive together in one round
    trip, ``realtime/aside.BEATS``); else one round trip each (``GroupCommit`` with ``max_items=1``)."""
    from marketplace.realtime import aside
    from marketplace.realtime.batches import GroupCommit

    written = BeatsWritten()

    async def round_of_beats() -> None:
        target = written.n + len(comms)
        for comm in comms:
            await comm.send_to(text_data=beat)
        await written.until(target)

    beat = json.dumps({"type": "heartbeat", "throughput": 1.0, "state": "generating", "job_id": job.pk})
    real = aside.BEATS
    if not together:
        aside.BEATS = GroupCommit(real.write, max_items=1)
    try:
        with written:
            await round_of_beats()
            await asyncio.sleep(0.5)  # the first round's database reports (the state each reports is new) are in
            cpu0, sql0, redis0 = time.process_time(), counters.sql, counters.redis
            for _ in range(args.publications):
                await round_of_beats()
    finally:
        aside.BEATS = real
    n = args.publications * len(comms)
    how = "written together" if together else "one round trip each"
    return {"message": f"heartbeat, {len(comms)} sockets at once, {how}", "n": n,
            "cpu_ms": 1000 * (time.process_time() - cpu0) / n, "sql": (counters.sql - sql0) / n,
            "redis": (counters.redis - redis0) / n}


async def folds(args, counters: Counters, job) -> dict:
    """The billing fold over every worker of the job, each generating (an install of the job's base recorded, one
    lease held) and last billed 10 s before it, as the fold finds them every 10 s: per worker, over ``--folds``
    folds."""
    from datetime import timedelta

    from channels.db import database_sync_to_async
    from django.conf import settings
    from django.db.models import F

    from dataplane.replay import PROMPT_GROUP, consumer_name, prompts_key
    from marketplace.infra import stream, telemetry
    from marketplace.models import Activation
    from marketplace.services import presence

    open_ = Activation.objects.filter(job_id=job.pk, ended_at=None)

    def generating() -> None:
        workers = list(open_.values_list("worker_id", flat=True))
        replay = stream.replay(job.pk)
        replay.add_prompts([f"{i}+1=" for i in range(len(workers))])
        for worker_id in workers:
            telemetry.record_observed(worker_id, job_id=job.pk, what="installed", at=time.time())
            replay.lease(worker_id=worker_id, count=1, timeout_s=float(settings.ECHO2["LEASE_TIMEOUT_S"]))

    def ten_seconds_on() -> int:
        """Every bill 10 s older, and every lease taken a second before it: 10 s of generating to bill."""
        count = open_.update(reported_at=F("reported_at") - timedelta(seconds=10))
        billed = {consumer_name(w): at.timestamp() for w, at in open_.values_list("worker_id", "reported_at")}
        client, now = stream.client(), time.time()
        for p in client.xpending_range(prompts_key(job.pk), PROMPT_GROUP, min="-", max="+", count=10_000):
            if p["consumer"] not in billed:  # the replay buffer's own (returned leases)
                continue
            client.xclaim(prompts_key(job.pk), PROMPT_GROUP, p["consumer"], 0, [p["message_id"]],
                          idle=int((now - billed[p["consumer"]] + 1) * 1000), justid=True)
        return count

    await database_sync_to_async(generating)()
    await database_sync_to_async(presence.activations_release_silent)()  # each found generating: its state recorded
    cpu = sql = redis = workers = 0
    for _ in range(args.folds):
        workers += await database_sync_to_async(ten_seconds_on)()  # not counted
        cpu0, sql0, redis0 = time.process_time(), counters.sql, counters.redis
        await database_sync_to_async(presence.activations_release_silent)()
        cpu, sql, redis = (cpu + time.process_time() - cpu0, sql + counters.sql - sql0,
                           redis + counters.redis - redis0)
    states = await database_sync_to_async(lambda: sorted(set(open_.values_list("state", flat=True))))()
    return {"message": f"billing fold, per worker ({workers // args.folds} in one job, {'/'.join(states)})",
            "n": workers, "cpu_ms": 1000 * cpu / workers, "sql": sql / workers, "redis": redis / workers}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--messages", type=int, default=200, help="Messages per row.")
    parser.add_argument("--groups", type=int, default=2, help="Groups per submit (and leased by it).")
    parser.add_argument("--group-size", type=int, default=8, help="Records per group (n).")
    parser.add_argument("--tokens", type=int, default=16, help="Completion tokens per record.")
    parser.add_argument("--sockets", type=int, default=20, help="Sockets of the lease rows (and workers folded).")
    parser.add_argument("--folds", type=int, default=5, help="Billing folds of the last row.")
    parser.add_argument("--publications", type=int, default=20,
                        help="Versions every socket reports at once in the install rows.")
    parser.add_argument("--json", type=Path, help="Also write the rows here.")
    parser.add_argument("--only", nargs="+", choices=ROW_KINDS, default=list(ROW_KINDS), metavar="ROWS",
                        help=f"Measure these rows only (of {', '.join(ROW_KINDS)}; all by default). The lease rows' "
                             "sockets are made for any of the last three.")
    parser.add_argument("--profile", choices=("heartbeat", "heartbeat, report due", "submit", "install report"),
                        help="Profile this row's block (cProfile, the event loop's thread only) into --profile-out.")
    parser.add_argument("--profile-out", type=Path, default=Path("message-cost.prof"),
                        help="Where --profile writes its stats (read them with python -m pstats).")
    args = parser.parse_args(argv)
    import psycopg

    workdir = Path(tempfile.mkdtemp(prefix="echo2-bench-msgcost-"))
    redis_port, name = free_port(), f"echo2_bench_msgcost_{os.getpid()}"
    redis_proc = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(redis_port), "--bind",
                                   "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", str(workdir)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        import redis

        wait_for(lambda: redis.Redis(port=redis_port).ping(), "redis", 30)
        setup_site(workdir, redis_port, PG_ADMIN_URL.rpartition("/")[0] + "/" + name)
        counters = Counters()
        counters.install()
        rows = asyncio.run(run(args, counters))
    finally:
        from django.db import connections

        connections.close_all()
        with psycopg.connect(PG_ADMIN_URL, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        redis_proc.terminate()
        redis_proc.wait(10)
        shutil.rmtree(workdir, ignore_errors=True)
    load = os.getloadavg()[0]
    print(f"site from {ROOT}; {args.groups} groups of {args.group_size} x {args.tokens} tokens per submit; "
          f"load average {load:.1f}")
    print("| message | n | CPU ms / message | SQL statements / message | Redis round trips / message |")
    print("| --- | --- | --- | --- | --- |")
    for row in rows:
        print(f"| {row['message']} | {row['n']} | {row['cpu_ms']:.2f} | {row['sql']:.2f} | {row['redis']:.2f} |")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

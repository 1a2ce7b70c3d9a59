"""The learner's read path: records/s of its stream reader beside raw XREADGROUP of the same entries.

Run: ``.venv/bin/python bench/bench_learner_read.py [--shapes demo long] [--rounds 7] [--groups-per-step 16] [--kappa 2]
[--prefetch] [--threads 1] [--redis-url URL] [--json PATH] [--profile]``

It starts a private ``redis-server`` on a free port (stopped by pid at the end; or uses ``--redis-url``, where it
writes only its own keys and deletes them), and for each record shape runs ``--rounds`` rounds of:

1. append the stream entries exactly as the site does (fields ``lease_id``, ``worker_id``, ``data``: the group
   in ``dataplane.groupcodec``'s columns), n = 8 records per group;
2. **raw**: XREADGROUP (a consumer group of its own) until the stream is drained, with the COUNT the learner asks
   for (a step's groups) and the same client settings (redis-py, bytes), doing nothing with the replies;
3. **learner**: what the learner does with the same entries between Redis and a training batch:
   the **reader**, ``StalenessGatedConsumer.next_batch`` (XREADGROUP, parsing and checking every group against the
   model's limits, the staleness gate) for ``--groups-per-step`` groups at a time; then collation of the batch
   into its padded tensors, and the acknowledgement (XACK + XDEL) of the entries every ``--kappa`` steps, when the
   learner's checkpoint commits them; no audits (they need a model), no read ahead unless ``--prefetch`` (in the
   learner it hides the reader behind a training step, which this bench does not take).

Shapes: ``demo``, the demo job's records (arithmetic, 5 prompt tokens, 2 completion tokens) and ``long``,
640-token completions. Printed per shape: the rates over all rounds (records over the summed seconds), their ratio
to raw beside the target (the reader at 30% of raw), and the lowest and highest ratio of a single round (raw and
learner ran back to back); then, for one group of the shape, its size and the ms the site takes to write it and the
learner to read it into columns, stored as JSON (the format before ``dataplane.groupcodec``) and in columns.
``--profile`` also prints the learner's cProfile (top functions by own time). torch runs on one thread, as the demo
runs the learner (``OMP_NUM_THREADS=1``): on a busy 2-core machine two threads make each small tensor operation of
the read path tens of times slower.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import random
import shutil
import subprocess
import sys
import time
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import redis  # noqa: E402
import torch  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane import replay  # noqa: E402
from dataplane.groupcodec import decode_group, decode_packed, encode_group  # noqa: E402
from dataplane.packed import pack_json  # noqa: E402
from dataplane.records import RecordLimits, Trajectory, TrajectoryGroup  # noqa: E402
from learner.batch import Workspace, collate_packed, concat  # noqa: E402
from learner.consumer import StalenessGatedConsumer  # noqa: E402

JOB = 1
GROUP = 8
VOCAB = 32_000
TARGET = 0.30
SHAPES = {"demo": (2, 3000), "long": (640, 300)}  # shape -> (completion tokens, groups per round)


def stored_data(tokens: int, rng: random.Random, index: int) -> bytes:
    """What the site stores for one returned group of ``tokens``-token completions (``dataplane.groupcodec``)."""
    a, b = rng.randrange(5), rng.randrange(5)
    prompt = f"{a}+{b}="
    prompt_ids = [1, *(rng.randrange(3, VOCAB) for _ in prompt)]
    records = [Trajectory(job_id=JOB, lease_id=f"{index}-0", group_id=f"g{index}", prompt=prompt, prompt_ids=prompt_ids,
                          completion=str(a + b) if tokens <= 2 else " ".join("tok" for _ in range(tokens)),
                          completion_ids=[rng.randrange(3, VOCAB) for _ in range(tokens)],
                          logprobs=[-rng.random() * 5 for _ in range(tokens)], reward=float(rng.random() < 0.5),
                          version=0) for _ in range(GROUP)]
    return encode_group(TrajectoryGroup.of(records))


def fill(client: redis.Redis, key: str, datas: list[bytes], groups: int) -> None:
    pipe = client.pipeline(transaction=False)
    for i in range(groups):
        pipe.xadd(key, {"lease_id": f"{i}-0", "worker_id": "1", "data": datas[i % len(datas)]})
        if i % 256 == 255:
            pipe.execute()
    pipe.execute()


def raw_read(client: redis.Redis, key: str, count: int) -> tuple[int, float]:
    """XREADGROUP every entry once (a group of its own); (entries, seconds)."""
    client.xgroup_create(key, "raw", id="0")
    entries, started = 0, time.perf_counter()
    while True:
        reply = client.xreadgroup("raw", "raw", {key: ">"}, count=count)
        if not reply or not reply[0][1]:
            return entries, time.perf_counter() - started
        entries += len(reply[0][1])


def learner_read(consumer: StalenessGatedConsumer, groups: int, args) -> tuple[int, float, float]:
    """The learner's read path over ``groups`` entries: batches read, collated, their entries acknowledged every
    ``kappa`` steps (when the learner's checkpoint would commit them); (groups, seconds, seconds in the reader)."""
    done, steps, held, workspace, reader_s = 0, 0, [], Workspace(), 0.0
    started = time.perf_counter()
    while done < groups:
        asked = time.perf_counter()
        wait = consumer.next_batch(groups=min(args.groups_per_step, groups - done), version=0, timeout_s=30)
        reader_s += time.perf_counter() - asked
        if wait is None:
            raise RuntimeError("the learner's reader found no data: the stream was not filled")
        collate_packed(concat((g.packed for g in wait.groups), workspace), pad_id=0, workspace=workspace)
        held += [g.entry_id for g in wait.groups]
        done, steps = done + len(wait.groups), steps + 1
        if steps % args.kappa == 0 or done == groups:
            consumer.ack_ids(held)
            held = []
    return done, time.perf_counter() - started, reader_s


def per_group(data: bytes) -> dict:
    """One stored group, the site's and the learner's work on it, as JSON (before) and in columns (now): bytes, and
    ms to write it (site) and to read it into columns (learner), the best of 5 repeats."""
    group, legacy = decode_group(data), decode_group(data).model_dump_json()

    def ms(work) -> float:
        runs = max(1, int(0.05 / max(timeit.timeit(work, number=1), 1e-6)))
        return min(timeit.repeat(work, number=runs, repeat=5)) / runs * 1e3

    return {"json_bytes": len(legacy), "column_bytes": len(data),
            "json_write_ms": ms(group.model_dump_json), "column_write_ms": ms(lambda: encode_group(group)),
            "json_read_ms": ms(lambda: pack_json(legacy)), "column_read_ms": ms(lambda: decode_packed(data))}


def run_shape(client: redis.Redis, shape: str, args, profile: cProfile.Profile | None) -> dict:
    tokens, groups = SHAPES[shape]
    rng = random.Random(0)
    datas = [stored_data(tokens, rng, i) for i in range(32)]
    key = replay.trajectories_key(JOB)
    limits = RecordLimits(vocab_size=VOCAB, max_completion_tokens=max(tokens, 2))
    seconds: dict[str, list[float]] = {"raw": [], "reader": [], "path": []}
    for _ in range(args.rounds):
        client.delete(key)
        consumer = StalenessGatedConsumer(client, JOB, staleness=4, limits=limits, prefetch=args.prefetch)
        fill(client, key, datas, groups)
        entries, raw_s = raw_read(client, key, args.groups_per_step)
        if profile is not None:
            profile.enable()
        read, path_s, reader_s = learner_read(consumer, groups, args)
        consumer.close()
        if profile is not None:
            profile.disable()
        assert entries == read == groups, (entries, read, groups)
        for name, spent in (("raw", raw_s), ("reader", reader_s), ("path", path_s)):
            seconds[name].append(spent)
    client.delete(key, replay.prompts_key(JOB), replay.counters_key(JOB))
    rates = {name: GROUP * groups * len(spent) / sum(spent) for name, spent in seconds.items()}
    return {"shape": shape, "tokens": tokens, "records": GROUP * groups, "count": args.groups_per_step, **rates,
            "reader_fraction": rates["reader"] / rates["raw"], "path_fraction": rates["path"] / rates["raw"],
            "reader_fraction_range": [min(r / p for r, p in zip(seconds["raw"], seconds["reader"], strict=True)),
                                      max(r / p for r, p in zip(seconds["raw"], seconds["reader"], strict=True))],
            "target": TARGET, **per_group(datas[0])}


def start_redis(workdir: Path) -> tuple[subprocess.Popen, str]:
    from echo2_site.demo import free_port, wait_for

    binary = shutil.which("redis-server")
    if binary is None:
        raise SystemExit("bench_learner_read: redis-server is not installed (or pass --redis-url)")
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    process = subprocess.Popen([binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                                "--dir", str(workdir)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for(lambda: redis.Redis(port=port, socket_timeout=1).ping(), "Redis", 20)
    return process, f"redis://127.0.0.1:{port}/0"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--groups-per-step", type=int, default=16, help="R/n: the demo job's 128 records in 16 groups")
    parser.add_argument("--kappa", type=int, default=2, help="Steps per checkpoint, which acknowledges their entries")
    parser.add_argument("--redis-url", help="Use this Redis instead of starting one (only this bench's keys).")
    parser.add_argument("--workdir", default=str(ROOT / "var" / "bench-learner-read"))
    parser.add_argument("--json", help="Also write the rows here.")
    parser.add_argument("--profile", action="store_true", help="Print the learner reader's cProfile too.")
    parser.add_argument("--prefetch", action="store_true",
                        help="Read the next batch ahead on the reader's thread, as the learner process does: the "
                        "reader then waits less, the read path as a whole gains little (parsing holds the GIL).")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (the demo runs the learner with 1).")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    if min(args.rounds, args.groups_per_step, args.kappa) < 1:
        parser.error("--rounds, --groups-per-step and --kappa: at least 1")
    process, url = (None, args.redis_url) if args.redis_url else start_redis(Path(args.workdir))
    profile = cProfile.Profile() if args.profile else None
    try:
        client = replay.connect(url, decode_responses=False, socket_timeout=30)  # as the learner connects
        rows = [run_shape(client, shape, args, profile) for shape in args.shapes]
        client.close()
    finally:
        if process is not None:
            process.terminate()
            process.wait(10)
    print_table(rows, args)
    if profile is not None:
        pstats.Stats(profile).sort_stats("tottime").print_stats(20)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


def print_table(rows: list[dict], args) -> None:
    table = Table(title=f"learner read vs raw XREADGROUP, records/s (n = {GROUP}, {args.groups_per_step} groups "
                        f"per step, {args.rounds} rounds{', read ahead' if args.prefetch else ''})")
    table.add_column("")
    for row in rows:
        table.add_column(f"{row['shape']} ({row['tokens']} tokens)", justify="right")
    table.add_row("raw XREADGROUP (COUNT = a step's groups)", *(f"{row['raw']:,.0f}" for row in rows))
    table.add_row("reader: next_batch", *(f"{row['reader']:,.0f}" for row in rows))
    table.add_row("  fraction of raw (target >= 30%)", *(f"{row['reader_fraction']:.1%}" for row in rows))
    table.add_row("  (rounds: lowest - highest)", *("{:.0%} - {:.0%}".format(*row["reader_fraction_range"])
                                                     for row in rows))
    table.add_row("reader + collation + acknowledgement", *(f"{row['path']:,.0f}" for row in rows))
    table.add_row("  fraction of raw", *(f"{row['path_fraction']:.1%}" for row in rows))
    table.add_section()
    table.add_row("one group: bytes, JSON / columns", *(f"{row['json_bytes']:,} / {row['column_bytes']:,}"
                                                       for row in rows))
    table.add_row("  site writes it, ms: JSON / columns", *(f"{row['json_write_ms']:.3f} / {row['column_write_ms']:.3f}"
                                                           for row in rows))
    table.add_row("  learner reads it, ms: JSON / columns", *(f"{row['json_read_ms']:.3f} / {row['column_read_ms']:.3f}"
                                                             for row in rows))
    Console().print(table)


if __name__ == "__main__":
    raise SystemExit(main())

"""Where the learner's step time goes when data is waiting: T_train's share of the step wall time.

Run: ``.venv/bin/python bench/bench_learner_steps.py [--steps 80] [--warmup 5] [--audit-fractions 0 0.05]
[--workdir var/bench-learner-steps] [--json PATH]``

It starts a private ``redis-server`` (AOF, ``appendfsync everysec``, as the demo runs it) and daphne over a fresh
SQLite database on free ports, builds the demo's tiny model (``echo2-learner init-model``), and for each audit
fraction runs one job of the demo's shape (arithmetic, R = 128, n = 8, kappa = 2, 2-token completions) with the
real ``echo2-learner`` process: before the learner starts, the job's trajectory stream already holds every group it
will train on, so it never waits for workers. The groups are honest (the tiny model's own completions, log-probs
and task rewards under version 0, so audits pass) and the job's staleness budget is the largest allowed (S = 1000)
so that version-0 groups stay admissible for the whole run. No Celery and no agents: publications are planned for
no worker.

Printed per run: the mean seconds per step of each part of the learner's own step split (``extra.timing`` of its
step reports, dataplane/timing.py: wait, train, checkpoint, publish, report, other), over the steps after
``--warmup``, and T_train's share of the wall time beside the 90% target. Every process it started is stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import pstats
import random
import shutil
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import httpx  # noqa: E402
import redis  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane import replay  # noqa: E402
from dataplane.groupcodec import encode_group  # noqa: E402
from dataplane.records import Trajectory, TrajectoryGroup  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from dataplane.timing import PARTS  # noqa: E402
from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, free_port, wait_for  # noqa: E402

BIN = Path(sys.executable).parent
BATCH, GROUP, KAPPA, STALENESS = 128, 8, 2, 1000
TASK = {"name": "arithmetic", "max_operand": 4}
TARGET = 0.90


def honest_groups(model_dir: Path, count: int, seed: int = 0) -> list[list[Trajectory]]:
    """``count`` groups of the demo's prompts as an honest agent returns them under version 0 (the HF engine)."""
    from worker_agent.engines import make_engine
    from worker_agent.engines.base import SamplingParams

    task, rng = build_task(TASK), random.Random(seed)
    engine = make_engine("hf", str(model_dir), device="cpu", seed=seed)
    prompts = [f"{rng.randint(0, 4)}+{rng.randint(0, 4)}=" for _ in range(count)]
    samples = engine.generate(prompts, n=GROUP, params=SamplingParams(max_new_tokens=2, temperature=1.0))
    return [[Trajectory(job_id=1, lease_id="0-0", group_id="g", prompt=prompt, prompt_ids=c.prompt_ids,
                        completion=c.text, completion_ids=c.completion_ids, logprobs=c.logprobs,
                        reward=task.reward(prompt, c.text), version=0) for c in completions]
            for prompt, completions in zip(prompts, samples, strict=True)]


def fill_stream(client: redis.Redis, job_id: int, groups: list[list[Trajectory]], entries: int) -> None:
    """``entries`` stream entries as the site writes them, cycling through ``groups`` under fresh ids."""
    key, pipe = replay.trajectories_key(job_id), client.pipeline(transaction=False)
    for i in range(entries):
        lease = f"{i + 1}-0"
        group = TrajectoryGroup.of([r.model_copy(update={"job_id": job_id, "lease_id": lease, "group_id": f"g{i}"})
                                    for r in groups[i % len(groups)]])
        pipe.xadd(key, {"lease_id": lease, "worker_id": "1", "data": encode_group(group)})
    pipe.execute()


class Bench:
    """Redis and the site, up for every run; one job per run."""

    def __init__(self, workdir: Path) -> None:
        self.workdir, self.redis_port, self.site_port = workdir, free_port(), free_port()
        self.server = f"http://127.0.0.1:{self.site_port}"
        env = dict(os.environ, DATABASE_URL=f"sqlite:///{workdir / 'site.sqlite3'}", DEBUG="true",
                   REDIS_URL=f"redis://127.0.0.1:{self.redis_port}/0", ECHO2_DATA_DIR=str(workdir),
                   DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT))
        self.stack = Stack(workdir, env)
        self.model_dir = workdir / "tiny-arithmetic"
        self.token = ""
        self.profile = False  # run the learner under cProfile (learner-<job>.prof in the workdir)

    def start(self) -> None:
        (self.workdir / "redis").mkdir(parents=True, exist_ok=True)
        self.stack.run(str(BIN / "echo2-learner"), "init-model", str(self.model_dir), "--task", "arithmetic")
        self.stack.start("redis", shutil.which("redis-server") or "redis-server", "--port", str(self.redis_port),
                         "--bind", "127.0.0.1", "--save", "", "--appendonly", "yes", "--appendfsync", "everysec",
                         "--dir", str(self.workdir / "redis"))
        wait_for(lambda: redis.Redis(port=self.redis_port, socket_timeout=1).ping(), "Redis", 20)
        self.stack.run(str(BIN / "python"), "manage.py", "migrate", "--noinput")
        script = ("from django.contrib.auth.models import User\nfrom marketplace.services import api_token_issue\n"
                  "print(api_token_issue(user=User.objects.create_user('owner', password='owner')))\n")
        self.token = self.stack.run(str(BIN / "python"), "manage.py", "shell", "-c", script).strip().splitlines()[-1]
        self.stack.start("daphne", str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(self.site_port),
                         *DAPHNE_WEBSOCKET_LIMITS, "echo2_site.asgi:application")
        wait_for(lambda: httpx.get(self.server + "/api/schema/", timeout=2).status_code == 200, "the site", 90)

    def api(self) -> httpx.Client:
        return httpx.Client(base_url=self.server + "/api/", headers={"Authorization": f"Token {self.token}"},
                            timeout=30)

    def run(self, groups: list[list[Trajectory]], *, steps: int, audit_fraction: float, timeout_s: float) -> list[dict]:
        """One job with its stream filled before the learner starts; the learner's step reports."""
        with self.api() as api:
            job = api.post("jobs/", json={
                "name": f"steps, audits {audit_fraction:g}", "model_dir": str(self.model_dir), "task": TASK,
                "staleness": STALENESS, "kappa": KAPPA, "batch_trajectories": BATCH, "group_size": GROUP,
                "learning_rate": 1e-3, "max_steps": steps, "max_new_tokens": 2}).raise_for_status().json()
            api.post(f"jobs/{job['id']}/start/").raise_for_status()
            client = redis.Redis(port=self.redis_port)
            fill_stream(client, job["id"], groups, steps * BATCH // GROUP + 4)
            client.close()
            command = [str(BIN / "echo2-learner")] if not self.profile else \
                [str(BIN / "python"), "-m", "cProfile", "-o", str(self.workdir / f"learner-{job['id']}.prof"), "-m",
                 "learner.cli"]
            learner = self.stack.start(
                f"learner-{job['id']}", *command, "--server", self.server, "--job", str(job["id"]),
                "--token", self.token, "--redis", f"redis://127.0.0.1:{self.redis_port}/0",
                "--snapshot-dir", str(self.workdir / f"snapshots-{job['id']}"),
                f"--audit-fraction={audit_fraction}")
            deadline = time.monotonic() + timeout_s
            while api.get(f"jobs/{job['id']}/").json()["status"] not in ("completed", "failed", "cancelled"):
                if time.monotonic() > deadline or learner.poll() is not None:
                    break
                time.sleep(0.5)
            status = api.get(f"jobs/{job['id']}/").json()["status"]
            learner.wait(60)
            if status != "completed":
                raise RuntimeError(f"job {job['id']} ended {status}; see {self.stack.logs}/learner-{job['id']}.log")
            return api.get(f"jobs/{job['id']}/metrics/").raise_for_status().json()


def split_row(metrics: list[dict], warmup: int) -> dict:
    """Mean seconds per step of each part over the steps after ``warmup``, and T_train's share of the wall."""
    timings = [m["extra"]["timing"] for m in metrics if m["step"] > warmup and (m.get("extra") or {}).get("timing")]
    if not timings:
        raise RuntimeError("no step reported its timing")
    mean = {part: statistics.fmean(t.get(part, 0.0) for t in timings) for part in (*PARTS, "other", "wall")}
    return {"steps": len(timings), "mean_s": mean, "train_share": mean["train"] / mean["wall"],
            "train_share_median": statistics.median(t["train_share"] for t in timings)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=5, help="Leave out the first steps (start-up, first writes).")
    parser.add_argument("--audit-fractions", type=float, nargs="+", default=[0.0, 0.05])
    parser.add_argument("--timeout", type=float, default=900.0, help="Seconds per run at most.")
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench-learner-steps")
    parser.add_argument("--json", help="Also write the rows here.")
    parser.add_argument("--profile", action="store_true", help="Run each learner under cProfile and print its top "
                        "functions by own time (learner-<job>.prof stays in the workdir).")
    args = parser.parse_args(argv)
    if args.steps <= args.warmup or any(not 0 <= f <= 1 for f in args.audit_fractions):
        parser.error("--steps must exceed --warmup; audit fractions are within [0, 1]")
    workdir = args.workdir.resolve()
    shutil.rmtree(workdir, ignore_errors=True)
    workdir.mkdir(parents=True)
    bench = Bench(workdir)
    bench.profile = args.profile
    rows = []
    try:
        bench.start()
        groups = honest_groups(bench.model_dir, 64)
        for fraction in args.audit_fractions:
            metrics = bench.run(groups, steps=args.steps, audit_fraction=fraction, timeout_s=args.timeout)
            rows.append({"audit_fraction": fraction, **split_row(metrics, args.warmup)})
    finally:
        bench.stack.stop()
    table = Table(title=f"learner step split with data waiting (tiny model, R = {BATCH}, n = {GROUP}, "
                        f"kappa = {KAPPA}; ms per step, mean over steps {args.warmup + 1}-{args.steps})")
    table.add_column("part of the step")
    for row in rows:
        table.add_column(f"--audit-fraction {row['audit_fraction']:g}", justify="right")
    for part in (*PARTS, "other", "wall"):
        table.add_row(part, *(f"{1e3 * row['mean_s'][part]:.1f}" for row in rows))
    table.add_row("T_train share (target >= 90%)", *(f"{row['train_share']:.1%}" for row in rows))
    Console().print(table)
    for path in sorted(workdir.glob("learner-*.prof")) if args.profile else []:
        print(f"== {path.name}")
        pstats.Stats(str(path)).sort_stats("tottime").print_stats(25)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

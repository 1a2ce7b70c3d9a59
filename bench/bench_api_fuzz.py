"""The whole REST API under schemathesis, every phase, against a real daphne on PostgreSQL.

``tests/marketplace/test_schema_fuzz.py`` fuzzes each operation in-process with a few examples; this is the broad
run a reviewer makes from outside: ``schemathesis run`` with the examples, coverage, fuzzing and stateful phases over
HTTP, once with the ids it makes up (mostly 404s) and once with every ``{id}`` set to the owner's own job or worker
(so fuzzed bodies reach the services), checks ``not_a_server_error`` and the schema's status codes, content types
and bodies. It prints, per operation with any failure, the server errors and other violations, and a total row:
the figure to hold is **0 server errors**.

By default a private PostgreSQL (``initdb`` in a temporary folder) and the machine's Redis on database 13; the
site's throttles are lifted (this measures answers, not rates).

    .venv/bin/python bench/bench_api_fuzz.py [--max-examples 20] [--max-time 120] [--admin-url postgres://...]
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # run as a script
    sys.path.insert(0, str(ROOT))

from bench.bench_db_burst import Database, PrivatePostgres, site_env, start_site  # noqa: E402
from echo2_site.demo import Stack  # noqa: E402

BIN = Path(sys.executable).parent
PHASES = "examples,coverage,fuzzing,stateful"
CHECKS = ("not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance")

SETUP = """
import json
from decimal import Decimal
from django.contrib.auth.models import User
from dataplane.jobs import parse_job_spec
from marketplace import services
from tests.marketplace.factories import checkpoint_dir
owner = User.objects.create_user("fuzz", password="fuzz-pass")
spec = parse_job_spec({"name": "fuzz", "model_dir": checkpoint_dir(), "task": {"name": "arithmetic"}})
job = services.job_create(owner=owner, spec=spec)
worker, _ = services.worker_register(user=owner, name="rig", gpu="test-gpu", price_per_hour=Decimal("0.3"),
                                     bandwidth_bps=12_500_000)
print(json.dumps({"token": services.api_token_issue(user=owner), "job": job.pk, "worker": worker.pk}))
"""


def config(made: dict, path: Path, *, own_ids: bool) -> Path:
    """A schemathesis.toml: with ``own_ids`` every ``{id}`` of a job (worker) operation is the owner's job (worker)."""
    lines = ['request-timeout = 30', '']
    if own_ids:
        for prefix, own in (("/api/workers/", made["worker"]), ("/api/jobs/", made["job"])):
            lines += ["[[operations]]", f'include-path-regex = "^{prefix}"', f"parameters = {{ id = {own} }}", ""]
    path.write_text("\n".join(lines) + "\n")
    return path


def fuzz(server: str, made: dict, workdir: Path, *, own_ids: bool, max_examples: int, max_time: int) -> Path:
    """One schemathesis run; returns its NDJSON event log."""
    events = workdir / f"events-{'own' if own_ids else 'any'}.ndjson"
    argv = [str(BIN / "schemathesis"), "--config-file", str(config(made, workdir / "st.toml", own_ids=own_ids)),
            "run", f"{server}/api/schema/", "--url", server, "--phases", PHASES, "--checks", CHECKS,
            "-H", f"Authorization: Token {made['token']}", "--max-examples", str(max_examples),
            "--max-time", str(max_time), "--workers", "2", "--request-timeout", "30", "--seed", "26",
            "--generation-database", "none", "--report", "ndjson", "--report-ndjson-path", str(events),
            "--continue-on-failure", "--no-color"]
    done = subprocess.run(argv, cwd=workdir, capture_output=True, text=True, timeout=max_time * 4 + 600)
    if not events.exists():
        raise RuntimeError(f"schemathesis ran nothing (exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return events


def tally(events: Path) -> tuple[int, dict[str, collections.Counter]]:
    """(cases run, {operation: Counter of failed check names}) from an NDJSON event log."""
    cases, failures = 0, collections.defaultdict(collections.Counter)
    for line in events.read_text().splitlines() if events.exists() else []:
        event = json.loads(line)
        for kind, body in event.items():
            if kind != "ScenarioFinished":
                continue
            recorder = body.get("recorder") or {}
            cases += len(recorder.get("cases") or {})
            for case_checks in (recorder.get("checks") or {}).values():
                for check in case_checks:
                    if str(check.get("status")).lower() == "failure":
                        label = body.get("label") or recorder.get("label") or "?"
                        failures[label][check.get("name", "?")] += 1
    return cases, failures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-examples", type=int, default=20, help="cases per operation and phase (default 20)")
    parser.add_argument("--max-time", type=int, default=120, help="seconds per run (two runs; default 120)")
    parser.add_argument("--admin-url", help="an existing server's postgres://.../postgres instead of a private one")
    parser.add_argument("--redis-url", default=os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/13"))
    parser.add_argument("--workdir", type=Path, default=ROOT / "var" / "bench-api-fuzz",
                        help="where the site's log and schemathesis' event logs go (emptied first)")
    args = parser.parse_args()
    server_pg = None if args.admin_url else PrivatePostgres().start()
    db = Database(args.admin_url or server_pg.admin_url, f"echo2_fuzz_{os.getpid()}")
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    try:
        db.create()
        results, errors = run(db, args)
    finally:
        db.drop()
        if server_pg is not None:
            server_pg.stop()
    report(results, errors)


def run(db: Database, args: argparse.Namespace) -> tuple[list, int]:
    """The site on ``db`` (migrated, an owner with a job and a worker), both schemathesis runs, and the count of
    server errors in the site's own log (what a check may miss: a reply cut off mid-stream)."""
    workdir, results = args.workdir, []
    env = site_env(workdir, db.url, args.redis_url, pool_max=10) | {"CELERY_TASK_ALWAYS_EAGER": "true"}
    stack = Stack(workdir, env)
    try:
        server, made = start_site(stack, SETUP)
        for own_ids in (False, True):
            print(f"schemathesis, {'own' if own_ids else 'made-up'} ids, up to {args.max_time} s ...", flush=True)
            start = time.monotonic()
            events = fuzz(server, made, workdir, own_ids=own_ids, max_examples=args.max_examples,
                          max_time=args.max_time)
            results.append((own_ids, time.monotonic() - start, *tally(events)))
    finally:
        stack.stop()
    return results, (workdir / "logs" / "daphne.log").read_text(errors="replace").count("Internal Server Error")


def report(results: list, logged_500s: int) -> None:
    print(f"{'ids':>10} | {'seconds':>7} | {'cases':>6} | {'server errors':>13} | {'other violations':>16} | operation")
    total_5xx = 0
    for own_ids, seconds, cases, failures in results:
        ids = "own" if own_ids else "made up"
        rows = sorted(failures.items()) or [("(none)", collections.Counter())]
        for label, counts in rows:
            server = counts.get("not_a_server_error", 0)
            total_5xx += server
            print(f"{ids:>10} | {seconds:>7.0f} | {cases:>6} | {server:>13} | {sum(counts.values()) - server:>16} | "
                  f"{label} {dict(counts) if counts else ''}")
    print(f"total server errors: {total_5xx} seen by schemathesis, {logged_500s} in the site's log (peer: 0)")


if __name__ == "__main__":
    main()

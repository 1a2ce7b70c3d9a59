"""Publication at fleet scale (issues 15 and 25): the chain plan and every worker's route for N workers, then the
learner's publish request and the fan-out to N agent sockets on the real site.

Run: ``.venv/bin/python bench/bench_publication.py [--sizes 1000 10000 100000] [--no-relay 0.1]
[--fanout-sizes 1000 10000 100000] [--members-max 10000] [--chunks 256] [--repeat 3]
[--database sqlite|postgres] [--no-fanout] [--rejoin-all] [--manifest-fetches 1000 10000] [--fetch-clients 64]``

The second table (``bench/publication_fanout.py`` says what is real there): the learner's ``POST /snapshots/``
time, the time until every agent socket has its own message, the site's CPU per worker and the Redis bytes of the
fan-out, beside the figures measured before (one channel-layer send per worker in the request). Targets
at 10 k workers: request under 1 s, every socket notified within 5 s. The third: the bytes of one worker's message,
the manifest by reference (now) against inline (before), per worker and per publication, and what the learner
sends instead: the manifest to each chain's head and each worker out of the chains, as the plan has them (the
others take it from their chain parent). The last (``bench/publication_manifests.py``): the learner's snapshot
server answering ``--manifest-fetches`` fetches of the version's ``manifest.json``, ``--fetch-clients`` at once
(the HTTP workers' and failed relays' fetches; every worker's, before the manifest went down the chains).

What a publication computes before it can tell N active workers where to pull from (``marketplace.services.
broadcast.snapshot_publish``): the score and rank of the relays and their assembly into ``N_ch`` chains
(``chains.assemble_chains``), the workers without a relay address placed as chain tails (``chains.place_tails``,
``--no-relay`` of the fleet, fastest first), and each worker's ``(parent, child)`` (``chains.routes``). Then, per
worker, its transfer credential (an HMAC, ``dataplane.credentials``), timed apart because it is per-message
work, not planning.

The peer column is the same plan computed the plain way the site used to: one sort of the chains per tail and
one scan of the chains per worker's route (O(N^2)); it is run up to 10 k workers (at 100 k it takes minutes).
Target: planning and routing under 1 s at 100 k workers; prints PASS or FAIL (exit 1).
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from dataplane.broadcast.chains import (  # noqa: E402
    ChainPlan,
    WorkerStats,
    assemble_chains,
    n_chains,
    place_tails,
    route,
    routes,
)
from dataplane.credentials import issue, new_secret  # noqa: E402

TARGET_S = 1.0
PEER_MAX_N = 10_000
NOW = 1_000_000.0


def fleet(n: int, *, no_relay: float, seed: int = 0) -> tuple[list[WorkerStats], list[int], float]:
    """``n`` workers' relay statistics (bandwidth 10-100 MB/s, some failures, seen within the decay window),
    the ids of the ``no_relay`` share without a relay address (fastest first) and the learner's uplink."""
    rng = random.Random(seed)
    stats = [WorkerStats(worker_id=i, bandwidth_bps=rng.uniform(1e7, 1e8), successes=rng.randrange(12),
                         failures=rng.choice([0, 0, 0, 1, 2, 4, 7]), last_seen=NOW - rng.uniform(0, 300),
                         last_failure_at=NOW - rng.uniform(0, 900)) for i in range(n)]
    tails = sorted(range(n, n + int(n * no_relay)), key=lambda _: rng.random())
    return stats, tails, 1e9 * max(1, n // 1000)


def plan_and_route(stats, tails, uplink) -> tuple[ChainPlan, dict]:
    n_ch = n_chains(uplink, statistics.median(s.bandwidth_bps for s in stats))
    plan = assemble_chains(stats, n_ch=n_ch, now=NOW)
    plan = place_tails(plan, tails, relays={s.worker_id for s in stats}, n_ch=n_ch)
    return plan, routes(plan)


def place_tails_plainly(plan: ChainPlan, tails, *, relays, n_ch: int) -> ChainPlan:
    """``chains.place_tails``' rule stated plainly, a sort of the chains per tail (O(T C log C)): the peer here
    and the reference tests/dataplane/broadcast/test_chains.py checks the fast one against."""
    built, rollout_only = [list(c) for c in plan.chains], list(plan.rollout_only)
    for worker_id in tails:
        open_chain = next((c for c in sorted(built, key=len) if not c or c[-1] in relays), None)
        if open_chain is not None:
            open_chain.append(worker_id)
        elif len(built) < n_ch:
            built.append([worker_id])
        else:
            rollout_only.append(worker_id)
    return ChainPlan(chains=tuple(tuple(c) for c in built if c), rollout_only=tuple(rollout_only))


def plan_and_route_plainly(stats, tails, uplink) -> tuple[ChainPlan, dict]:
    """The O(N^2) peer: a sort of the chains per tail, a scan of the chains per route."""
    n_ch = n_chains(uplink, statistics.median(s.bandwidth_bps for s in stats))
    plan = assemble_chains(stats, n_ch=n_ch, now=NOW)
    plan = place_tails_plainly(plan, tails, relays={s.worker_id for s in stats}, n_ch=n_ch)
    everyone = [s.worker_id for s in stats] + list(tails)
    return plan, {w: r for w in everyone if (r := route(plan, w)) is not None}


def timed(fn, *args) -> tuple[float, object]:
    started = time.perf_counter()
    out = fn(*args)
    return time.perf_counter() - started, out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000])
    parser.add_argument("--no-relay", type=float, default=0.1, help="share of workers without a relay address")
    parser.add_argument("--fanout-sizes", type=int, nargs="+", default=[1_000, 10_000, 100_000],
                        help="active workers of the publication runs on the real site")
    parser.add_argument("--members-max", type=int, default=10_000,
                        help="agent sockets (channel-layer members) at most; a bigger fleet has the rest in the plan "
                             "with no socket in this process, as other site processes would hold them")
    parser.add_argument("--chunks", type=int, default=256, help="chunks in the published manifest (256: ~28 KB)")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each publication size up to 10 k workers "
                        "(bigger ones run once); the table shows medians and the worst")
    parser.add_argument("--database", choices=("sqlite", "postgres"), default="sqlite",
                        help="the site's database: a fresh SQLite file, or a fresh database on PostgreSQL at "
                             "127.0.0.1:5432 (dropped at the end)")
    parser.add_argument("--no-fanout", action="store_true", help="print only the planning table (no site)")
    parser.add_argument("--rejoin-all", action="store_true",
                        help="every socket's membership due for its re-join at the publication (the worst case); "
                             "by default the sockets joined just before it")
    parser.add_argument("--manifest-fetches", type=int, nargs="*", default=[1_000, 10_000],
                        help="manifest.json fetches from the learner's snapshot server to time (none: skip)")
    parser.add_argument("--fetch-clients", type=int, default=64, help="manifest fetches in flight at once")
    args = parser.parse_args(argv)
    table = Table(title=f"Publication planning and routing ({args.no_relay:.0%} of workers without a relay)")
    for col in ("workers", "chains", "plan+route s", "target s", "plain O(N^2) s", "speed-up",
                "credentials s", "per worker us"):
        table.add_column(col, justify="right")
    secret, ok = new_secret(), True
    for n in args.sizes:
        relays, tails, uplink = fleet(int(n * (1 - args.no_relay)), no_relay=args.no_relay / (1 - args.no_relay))
        seconds, (plan, found) = timed(plan_and_route, relays, tails, uplink)
        plain = "-"
        speedup = "-"
        if n <= PEER_MAX_N:
            plain_s, (plain_plan, plain_routes) = timed(plan_and_route_plainly, relays, tails, uplink)
            assert plain_plan == plan and plain_routes == found, "the plans differ"
            plain, speedup = f"{plain_s:.3f}", f"{plain_s / seconds:.0f}x"
        cred_s, _ = timed(lambda ids: [issue(secret, job_id=1, worker_id=w, lowest=5, highest=5, expires=2**31)
                                       for w in ids], list(found))
        ok &= n < 100_000 or seconds < TARGET_S
        table.add_row(f"{n:,}", f"{len(plan.chains):,}", f"{seconds:.3f}", f"{TARGET_S:.1f}", plain, speedup,
                      f"{cred_s:.3f}", f"{1e6 * cred_s / max(1, len(found)):.1f}")
    console = Console(width=max(Console().width, 170))
    console.print(table)
    print("PASS" if ok else f"FAIL: planning and routing took over {TARGET_S} s at 100 k workers")
    if not args.no_fanout:
        from bench import publication_fanout as fanout

        rows, fanout_ok = fanout.run(args.fanout_sizes, no_relay=args.no_relay, members_max=args.members_max,
                                     chunks=args.chunks, repeat=args.repeat, database=args.database,
                                     rejoin_all=args.rejoin_all)
        console.print(fanout.table(rows, chunks=args.chunks, rejoin_all=args.rejoin_all))
        console.print(fanout.message_table(rows, chunks=args.chunks))
        print("PASS" if fanout_ok else f"FAIL: at {fanout.TARGET_N:,} workers the request took "
              f"{fanout.REQUEST_TARGET_S} s or more, or some socket waited {fanout.NOTIFIED_TARGET_S} s or more")
        ok &= fanout_ok
    if args.manifest_fetches:
        from bench import publication_manifests as manifests

        console.print(manifests.table(manifests.run(args.manifest_fetches, clients=args.fetch_clients,
                                                    chunks=args.chunks), chunks=args.chunks))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())

"""A live poisoning run: forged groups trained before the learner's audits catch and suspend the forger.

Run: ``.venv/bin/python bench/bench_poisoning.py [--lives 3] [--honest 2] [--fraction 0.05] [--probation 16]
[--suspend-after 3] [--groups-per-round 4] [--confident 0.05] [--max-steps 3000] [--logprob-rule new|old]
[--seed 0]``

What runs is the learner's own read, audit and train path on the tiny model (CPU): a private ``redis-server`` on a
free port holds the job's prompt and trajectory streams; producers lease prompts and return groups through the same
Redis scripts the site uses (``ReplayBuffer.lease`` / ``return_group``, which stamp the worker id), and a real
``LearnerLoop`` (``StalenessGatedConsumer`` with the ``Auditor`` the learner builds, ``PolicyTrainer`` GRPO steps,
checkpoints, acknowledgements) reads, audits and trains on them. The Django site and the agents' websocket are not
in the loop: the bench plays the site's rules on each step report (docs/trust.md "Failed work"): a worker with a
failed audit is released from the job at once (it stops producing, its leases go back, it is never planned for the
job again); only failures the site verifies itself count toward suspension across owners (a reward re-scored with
the built-in task: the ``reward`` forgery; a text decoded with the job's tokenizer: the ``text`` forgery),
``--suspend-after`` of them; a log-prob failure is that owner's word and suspends no one. Billing: the owner pays
each producer's generating time while it is active, at ``--price`` $/h (the site bills leases outstanding,
docs/ledger.md), less the credits for failed work (docs/ledger.md "Credits for failed work": the generating time of
each failed group the report gives evidence of and the site can check: a reward it re-scores, a text or log-prob
claim about the stored group); the table gives what the forged groups cost net of those credits.
The run is unbounded: forgers forge until they are released (``--max-steps``
learner steps bound it), so the policy trains to confidence on the honest work (``--confident``: the honest groups'
mean log-prob per token above minus that), where a constant claim of -0.01 per token is close to the truth on most
tokens (``--logprob-rule old``: the mean gap per token alone, as before, to compare).
The producers generate with the agent's HF engine under the learner's newest version, as agents do after
installing a snapshot.

Producers: ``--honest`` honest workers, and for each forgery and strategy ``--lives`` forgers:

- forgeries: ``reward`` (every record claims reward 1), ``logprobs`` (every claimed log-prob -0.01, no policy run),
  ``text`` (the completion text set to the right answer and its reward to 1, the token ids left as the sampled,
  wrong completion: the text is what the reward is computed from, the ids what the policy is trained on);
- strategies: ``always`` forges from its first group; ``after-probation`` sends ``ceil(probation / fraction)``
  honest groups (until its audit share reached the base fraction) and then forges every group; ``when-confident``
  sends honest groups until the policy is confident (and at least ``ceil(probation / fraction)``), then forges.

The table gives per forgery and strategy the forged groups trained before the first failed audit and before
suspension (mean and largest over the lives), the share of forged groups audited, and the bound docs/trust.md
states ("Audits", probation). The text check's cost per group is measured on the honest groups at the end.
"""

from __future__ import annotations

import argparse
import math
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import redis
import torch
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.jobs import JobSpec  # noqa: E402
from dataplane.records import TrajectoryGroup  # noqa: E402
from dataplane.replay import ReplayBuffer, StoredGroup, trajectories_key  # noqa: E402
from dataplane.tasks import build_task  # noqa: E402
from echo2_site.demo import free_port  # noqa: E402
from learner.audit import Auditor, AuditSettings, text_mismatches  # noqa: E402
from learner.checkpoint import CheckpointStore  # noqa: E402
from learner.consumer import StalenessGatedConsumer  # noqa: E402
from learner.loop import LearnerLoop  # noqa: E402
from learner.policy import build_policy  # noqa: E402
from learner.tiny import build_tiny_model  # noqa: E402
from marketplace.core.audit_checks import LOGPROB_FLOOR, LOGPROB_SHARE  # noqa: E402
from worker_agent.engines import make_engine  # noqa: E402
from worker_agent.engines.base import SamplingParams  # noqa: E402
from worker_agent.rollout import rollout_groups  # noqa: E402

JOB = 1
TASK_SPEC = {"name": "arithmetic", "max_operand": 9}
TASK = build_task(TASK_SPEC)
FORGERIES = ("reward", "logprobs", "text")
STRATEGIES = ("always", "after-probation", "when-confident")
OLD_RULE = {"logprob_share": 1.0, "logprob_tolerance": 0.05}  # the mean gap per token alone, at its old default


def forge(kind: str, group: TrajectoryGroup) -> TrajectoryGroup | None:
    """The forged version of an honest ``group``; None when the forgery changes nothing (every answer right)."""
    def changed(record) -> dict:
        right = str(TASK.answer(record.prompt))
        if kind == "reward":
            return {"reward": 1.0} if record.reward != 1.0 else {}
        if kind == "logprobs":
            return {"logprobs": [-0.01] * len(record.logprobs)}
        return {"completion": right, "reward": 1.0} if record.completion != right else {}
    updates = [changed(r) for r in group.records]
    if not any(updates):
        return None
    return TrajectoryGroup.of([r.model_copy(update=u) for r, u in zip(group.records, updates, strict=True)])


@dataclass
class Producer:
    worker_id: int
    forgery: str | None = None  # None: honest
    strategy: str = "always"
    honest_first: int = 0  # groups sent honestly before forging
    sent: int = 0
    forged: set[str] = field(default_factory=set)  # stream entry ids of its forged groups
    failures: int = 0
    trained_at_detection: int | None = None  # its forged groups trained when its first failure was reported
    released: bool = False  # from the job, at its first failed report (the owner's word suffices)
    verified: int = 0  # failures the site re-scores itself: only these count toward suspension
    suspended: bool = False  # across owners, on verified failures alone
    billed_s: float = 0.0  # generating time the owner pays
    forged_billed_s: float = 0.0  # of which generating groups it then forged
    credited_s: float = 0.0  # given back: failed groups the site checked (docs/ledger.md "Credits for failed work")
    forged_credited_s: float = 0.0  # of which forged groups
    seconds: dict[str, float] = field(default_factory=dict)  # each group's generating time, by stream entry
    forging: bool = False  # a when-confident forger, once the policy is confident
    gaps: dict[str, float] = field(default_factory=dict)  # each forged group's mean |claimed - true| log-prob

    def produce(self, replay: ReplayBuffer, engine, *, count: int, n: int, version: int,
                params: SamplingParams) -> list[StoredGroup]:
        started = time.perf_counter()
        leases = replay.lease(worker_id=self.worker_id, count=count, timeout_s=600)
        honest = rollout_groups(engine, TASK, leases, job_id=JOB, n=n, params=params, version=version)
        each = (time.perf_counter() - started) / max(1, len(honest))
        self.billed_s += each * len(honest)
        out = []
        for group in honest:
            due = self.sent >= self.honest_first and (self.strategy != "when-confident" or self.forging)
            fake = forge(self.forgery, group) if self.forgery and due else None
            entry = replay.return_group(worker_id=self.worker_id, group=fake or group)
            self.seconds[entry] = each
            if fake is not None:
                self.forged.add(entry)
                self.forged_billed_s += each
                self.gaps[entry] = _claim_gap(fake, group)
            out.append(StoredGroup(entry, group, worker_id=self.worker_id))
            self.sent += 1
        return out


class PoisoningRun:
    """One job: the learner loop on a private Redis, honest producers and forgers."""

    def __init__(self, args: argparse.Namespace, workdir: Path, redis_url: str) -> None:
        self.args = args
        self.model_dir = build_tiny_model(workdir / "tiny", alphabet=TASK.alphabet, hidden=32, layers=1)
        self.spec = JobSpec(name="poisoning", model_dir=str(self.model_dir), task=TASK_SPEC, staleness=16, kappa=4,
                            batch_trajectories=args.groups_per_step * args.n, group_size=args.n, max_steps=10**6,
                            max_new_tokens=4, learning_rate=args.learning_rate)
        trainer, tokenizer = build_policy(self.spec, device="cpu")
        self.client = redis.Redis.from_url(redis_url)
        self.replay = ReplayBuffer(self.client, JOB)
        self.versions = {0: self._state(trainer)}
        self.auditor = Auditor(
            _scoring_copy(trainer), pad_id=trainer.pad_id, task=TASK, weights=self.versions.get,
            decode=lambda ids: tokenizer.batch_decode(ids, skip_special_tokens=True),
            settings=AuditSettings(fraction=args.fraction, probation_groups=args.probation,
                                   **(OLD_RULE if args.logprob_rule == "old" else {})),
            key=random.Random(args.seed).randbytes(32))
        consumer = StalenessGatedConsumer(self.client, JOB, self.spec.staleness)
        consumer.audit = self.auditor
        self.trained: set[str] = set()
        self.loop = LearnerLoop(spec=self.spec, trainer=trainer, consumer=consumer,
                                checkpoints=CheckpointStore(workdir / "checkpoint"),
                                identity={"job_id": JOB, "created_at": "bench"}, on_trained=self._trained)
        self.engine = make_engine("hf", str(self.model_dir), device="cpu", seed=args.seed)
        self.engine_version = 0
        self.params = SamplingParams(max_new_tokens=self.spec.max_new_tokens, temperature=1.0)
        wait = math.ceil(args.probation / args.fraction)
        self.producers = [Producer(1 + i) for i in range(args.honest)] + [
            Producer(100 + len(FORGERIES) * len(STRATEGIES) * life + k, forgery=kind, strategy=strategy,
                     honest_first=0 if strategy == "always" else wait)
            for life in range(args.lives)
            for k, (kind, strategy) in enumerate((f, s) for f in FORGERIES for s in STRATEGIES)
            if kind in args.forgeries and strategy in args.strategies]
        self.honest_sample: list[StoredGroup] = []
        self.rng = random.Random(args.seed)
        self.confidence: list[float] = []  # the honest groups' mean claimed log-prob per token, per round
        self.confident_at: int | None = None  # the learner version at which the policy became confident

    @staticmethod
    def _state(trainer) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone() for k, v in trainer.module.state_dict().items()}

    def _trained(self, version: int, ids: list[str]) -> None:
        self.trained.update(ids)
        self.versions[version] = self._state(self.loop.trainer)
        for old in [v for v in self.versions if 0 < v < version - self.spec.staleness - 1]:
            del self.versions[old]

    def run(self) -> float:
        started = time.perf_counter()
        while any(p.forgery and not p.released for p in self.producers) and self.loop.version < self.args.max_steps:
            self._round()
        while self.loop.step(timeout_s=0.05) is not None:  # what is left in the stream
            self._site_reads_report()
        self.loop.settle()
        return time.perf_counter() - started

    def _round(self) -> None:
        """Every producer still working returns a few groups under the newest version; the learner trains on
        whatever whole steps are there, and the bench reads its audit reports as the site would."""
        if self.engine_version != self.loop.version:
            self.engine.load_weights(self.versions[self.loop.version])
            self.engine_version = self.loop.version
        working = [p for p in self.producers if not p.released]
        # at most half the staleness budget's groups per round, so that what a round returns is trained, not stale
        count = max(1, min(self.args.groups_per_round,
                           self.spec.staleness * self.args.groups_per_step // (2 * len(working))))
        self.replay.add_prompts([q.text for q in TASK.sample_prompts(self.rng, count * len(working))])
        honest: list[StoredGroup] = []
        for producer in working:
            made = producer.produce(self.replay, self.engine, count=count, n=self.args.n, version=self.loop.version,
                                    params=self.params)
            if producer.forgery is None and len(self.honest_sample) < 256:
                self.honest_sample.extend(made)
            if producer.forgery is None:
                honest.extend(made)
        self._confidence(honest)
        while self._unread() + len(self.loop.consumer.buffer) >= self.args.groups_per_step:
            if self.loop.step(timeout_s=0.2) is None:  # what was read was dropped (audits, staleness)
                break
            self._site_reads_report()
        self._site_reads_report()

    def _confidence(self, honest: list[StoredGroup]) -> None:
        """The policy's confidence from the honest groups of this round: their mean log-prob per learning token;
        once above ``-args.confident`` (mean of the last 5 rounds), when-confident forgers start forging."""
        logps = [lp for g in honest for lp, m in zip(g.packed.logprobs, g.packed.mask, strict=True) if m]
        if logps:
            self.confidence.append(statistics.mean(logps))
        recent = self.confidence[-5:]
        if self.confident_at is None and len(recent) == 5 and statistics.mean(recent) > -self.args.confident:
            self.confident_at = self.loop.version
            for producer in self.producers:
                producer.forging = True

    def _unread(self) -> int:
        """Entries of the trajectory stream not yet delivered to the learner: in the stream, less those delivered
        and not acknowledged (Redis's ``lag`` is unknown once entries were deleted, as acknowledged ones are)."""
        key = trajectories_key(JOB)
        return self.client.xlen(key) - int(self.client.xpending(key, "learner")["pending"])

    def _site_reads_report(self) -> None:
        by_id = {p.worker_id: p for p in self.producers}
        for outcome in self.auditor.report():
            producer = by_id[outcome["worker_id"]]
            if not outcome["failed"]:
                continue
            if producer.trained_at_detection is None:
                producer.trained_at_detection = len(producer.forged & self.trained)
            producer.failures += outcome["failed"]
            if not producer.released:  # the site: released from the job, its leases back, never planned again
                producer.released = True
                self.replay.return_leases(worker_id=producer.worker_id)
            # verified by the site: a reward re-scored with the built-in task, a text decoded with the job's
            # tokenizer (a one-turn task: marketplace/services/audit_texts.py)
            if producer.forgery in ("reward", "text"):
                producer.verified += outcome["failed"]
            for item in outcome["evidence"]:  # the failures the site checks are credited to the owner
                if not item["passed"] and creditable(item):
                    seconds = producer.seconds.get(item["entry_id"], 0.0)
                    producer.credited_s += seconds
                    if item["entry_id"] in producer.forged:
                        producer.forged_credited_s += seconds
            producer.suspended = producer.suspended or producer.verified >= self.args.suspend_after

    def text_check_us(self) -> tuple[float, float]:
        """Microseconds per group of the text check (every group read) and of a full audit (a sampled one)."""
        groups = self.honest_sample[:64]
        started = time.perf_counter()
        for _ in range(5):
            assert text_mismatches(groups, self.auditor.decode) == {}
        text = (time.perf_counter() - started) / 5 / len(groups)
        started = time.perf_counter()
        self.auditor.check_many(groups)
        return 1e6 * text, 1e6 * (time.perf_counter() - started) / len(groups)


def _claim_gap(forged: TrajectoryGroup, honest: TrajectoryGroup) -> float:
    """The forged group's mean |claimed - true| log-prob per token (the engine's own as the truth): the error its
    importance ratios carry into the loss when it is trained."""
    pairs = [(a, b) for f, h in zip(forged.records, honest.records, strict=True)
             for a, b in zip(f.logprobs, h.logprobs, strict=True)]
    return statistics.mean(abs(a - b) for a, b in pairs) if pairs else 0.0


def creditable(item: dict) -> bool:
    """Whether the site checks this failure against the stored group and credits it (marketplace/core/audit_checks
    .py): a reward it re-scores; a text or log-prob claim about the stored group (a log-prob one past the site's
    floor or share)."""
    if item["check"] == "logprobs":
        return item["logprob_gap"] >= LOGPROB_FLOOR or item.get("logprob_outside", 0.0) > LOGPROB_SHARE
    return item["check"] in ("reward", "text")


def _scoring_copy(trainer) -> torch.nn.Module:
    import copy

    return copy.deepcopy(trainer.module).eval().requires_grad_(False)


def bound(kind: str, strategy: str, args: argparse.Namespace) -> str:
    """What docs/trust.md ("Audits", probation) states: forged groups trained before suspension, in expectation."""
    if kind == "text" or strategy == "always":
        return "0"
    if strategy == "when-confident":
        return f"E <= {(1 - args.fraction) / args.fraction:.0f} (if caught)"
    return f"E <= {(1 - args.fraction) / args.fraction:.0f}"


def table(run: PoisoningRun, args: argparse.Namespace) -> Table:
    out = Table(title=f"Forged groups trained and billed under the site's rules (base fraction {args.fraction:g}, "
                      f"probation {args.probation}, suspended after {args.suspend_after} verified failures, "
                      f"{args.lives} lives each, groups of {args.n}, ${args.price:g}/h, log-prob rule "
                      f"{args.logprob_rule})")
    for col in ("forgery", "strategy", "forged sent", "trained before 1st failure, mean / max",
                "trained in all, mean / max", "released from job", "suspended across owners",
                "log-prob error of forged trained, mean / max", "forged ms billed, mean",
                "forged ms credited, mean", "$ billed for forged, net",
                "bound, docs/trust.md"):
        out.add_column(col, justify="right")
    for kind in args.forgeries:
        for strategy in args.strategies:
            lives = [p for p in run.producers if p.forgery == kind and p.strategy == strategy]
            first = [p.trained_at_detection if p.trained_at_detection is not None else len(p.forged & run.trained)
                     for p in lives]
            total = [len(p.forged & run.trained) for p in lives]
            forged_s = [p.forged_billed_s for p in lives]
            credited_s = [p.forged_credited_s for p in lives]
            errors = [p.gaps[e] for p in lives for e in p.forged & run.trained]
            out.add_row(kind, strategy, str(sum(len(p.forged) for p in lives)),
                        f"{statistics.mean(first):.1f} / {max(first)}", f"{statistics.mean(total):.1f} / {max(total)}",
                        f"{sum(p.released for p in lives)} of {len(lives)}",
                        f"{sum(p.suspended for p in lives)} of {len(lives)}",
                        f"{statistics.mean(errors):.3f} / {max(errors):.3f}" if errors else "-",
                        f"{1e3 * statistics.mean(forged_s):.1f}", f"{1e3 * statistics.mean(credited_s):.1f}",
                        f"{(sum(forged_s) - sum(credited_s)) * args.price / 3600:.6f}", bound(kind, strategy, args))
    honest = [p for p in run.producers if p.forgery is None]
    out.add_row("none (honest)", "-", f"{sum(p.sent for p in honest)} sent",
                f"{sum(p.failures for p in honest)} failed audits", f"{len(run.trained)} (all producers)",
                f"{sum(p.released for p in honest)} of {len(honest)}", f"{sum(p.suspended for p in honest)} of "
                f"{len(honest)}", "-", f"{1e3 * statistics.mean(p.billed_s for p in honest):.0f} (all its work)",
                f"{1e3 * statistics.mean(p.credited_s for p in honest):.1f}", "-", "0 failures")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lives", type=int, default=3, help="Forgers per forgery and strategy.")
    parser.add_argument("--honest", type=int, default=2, help="Honest producers.")
    parser.add_argument("--fraction", type=float, default=0.05, help="The base audit fraction (--audit-fraction).")
    parser.add_argument("--probation", type=int, default=16, help="--audit-probation.")
    parser.add_argument("--suspend-after", type=int, default=3, help="ECHO2_AUDIT_SUSPEND_AFTER (verified).")
    parser.add_argument("--price", type=float, default=0.30, help="$/h the owner pays each producer.")
    parser.add_argument("--max-steps", type=int, default=3000, help="Learner steps at most (forgers forge until "
                        "released; one the audits never catch would run for ever).")
    parser.add_argument("--confident", type=float, default=0.05, help="The policy is confident once the honest "
                        "groups' mean log-prob per token is above minus this (when-confident forgers start then).")
    parser.add_argument("--learning-rate", type=float, default=1e-2, help="The job's learning rate (higher than "
                        "the JobSpec default, so the tiny policy grows confident within a run).")
    parser.add_argument("--logprob-rule", choices=("new", "old"), default="new", help="old: the mean gap per token "
                        "alone (before the per-token allowance), to compare.")
    parser.add_argument("--groups-per-round", type=int, default=4, help="Groups each producer returns per round.")
    parser.add_argument("--groups-per-step", type=int, default=8, help="Groups per learner step (R / n).")
    parser.add_argument("--n", type=int, default=4, help="Records per group.")
    parser.add_argument("--forgeries", nargs="+", choices=FORGERIES, default=list(FORGERIES))
    parser.add_argument("--strategies", nargs="+", choices=STRATEGIES, default=list(STRATEGIES))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if not 0 < args.fraction <= 1 or min(args.lives, args.probation, args.suspend_after, args.n) < 1:
        parser.error("--fraction must be in (0, 1]; --lives, --probation, --suspend-after and --n at least 1")
    torch.set_num_threads(1)
    torch.manual_seed(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        server = subprocess.Popen([shutil.which("redis-server") or "redis-server", "--port", str(port), "--bind",
                                   "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", tmp],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            _wait_for_redis(port)
            run = PoisoningRun(args, Path(tmp), f"redis://127.0.0.1:{port}/0")
            seconds = run.run()
            Console(width=220).print(table(run, args))
            text_us, audit_us = run.text_check_us()
            recent = run.confidence[-5:]
            print(f"policy confident (mean honest log-prob per token > -{args.confident:g}) at learner version "
                  f"{run.confident_at}; at the end {statistics.mean(recent) if recent else float('nan'):.4f} per token")
            print(f"{run.loop.version} learner steps in {seconds:.1f} s; {run.auditor.unauditable} sampled groups "
                  f"unauditable, {run.loop.consumer.dropped_total} records dropped as stale; the text check of every "
                  f"group read: {text_us:.0f} us per group of {args.n} (a full audit of a sampled group: "
                  f"{audit_us:.0f} us)")
        finally:
            server.terminate()
            server.wait(timeout=10)
    return 0


def _wait_for_redis(port: int) -> None:
    client = redis.Redis(port=port)
    for _ in range(100):
        try:
            client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    raise RuntimeError(f"redis-server on port {port} did not start")


if __name__ == "__main__":
    sys.exit(main())

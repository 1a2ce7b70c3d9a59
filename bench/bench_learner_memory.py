"""Learner memory against model size: one process (what DDP holds on every rank) vs FSDP over 2 ranks.

Run: ``.venv/bin/python bench/bench_learner_memory.py [--sizes 42M,110M,358M] [--fsdp-fp32]``

Llama-architecture models (vocabulary 32000, tied embeddings) are built here from a config, randomly
initialised, and trained by the learner's own :class:`learner.step.PolicyTrainer` on synthetic groups (8
sequences of 16 tokens, AdamW): one process in fp32 (a DDP rank holds exactly this), and two gloo ranks
under ``torchrun`` sharded by :func:`learner.fsdp.shard` with bf16 mixed precision (fp32 master weights).
Per configuration and rank:

- ``theory``: fp32 parameters + gradients + AdamW's two moments, 16 bytes per parameter, / world size;
- ``held``: the bytes of the tensors this rank really holds after a step (its parameters, gradients and
  optimizer state; local shards under FSDP) -- the CPU has no allocator counter like CUDA's, this is it;
- ``RSS set-up``: resident memory once the policy is built (every rank loads the whole model first);
- ``peak step``: the highest resident memory during the first training step (``VmHWM``, reset before it;
  AdamW's moments are made in it), on rank 0, and the highest of the other ranks from set-up to the end;
- ``snapshot``: seconds and peak RSS of publishing a snapshot (``SnapshotStore.write`` of
  ``PolicyTrainer.full_state()``: gathered tensor by tensor, serialised, chunked, written to a temporary
  directory).

A size whose one-process run would need more than half the available memory is skipped with a line.
About 3 minutes on 2 cores with the default sizes.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dataplane.jobs import LossConfig  # noqa: E402
from dataplane.records import Trajectory  # noqa: E402

SIZES = {  # name: (hidden, layers, intermediate)
    "42M": (512, 8, 1408),
    "110M": (768, 12, 2048),
    "358M": (1280, 16, 3456),
}
VOCAB = 32000
GB = 1e9


def llama(size: str):
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, intermediate = SIZES[size]
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=hidden, intermediate_size=intermediate,
                         num_hidden_layers=layers, num_attention_heads=hidden // 64, num_key_value_heads=hidden // 64,
                         max_position_embeddings=64, tie_word_embeddings=True, pad_token_id=0)
    torch.manual_seed(0)  # the same weights on every rank
    return LlamaForCausalLM(config)


def parameter_count(size: str) -> int:
    hidden, layers, intermediate = SIZES[size]
    return VOCAB * hidden + layers * (4 * hidden * hidden + 3 * hidden * intermediate + 2 * hidden) + hidden


def records() -> list[Trajectory]:
    rng = random.Random(0)
    out = []
    for g in range(2):
        prompt = [1, *(rng.randrange(3, VOCAB) for _ in range(7))]
        for _ in range(4):
            out.append(Trajectory(job_id=1, lease_id=f"l{g}", group_id=f"g{g}", prompt="p", prompt_ids=prompt,
                                  completion="c", completion_ids=[rng.randrange(3, VOCAB) for _ in range(8)],
                                  logprobs=[-2.0] * 8, reward=float(rng.random() < 0.5), version=0))
    return out


def rss(field: str = "VmRSS") -> int:
    """This process's resident memory (``VmRSS``) or its peak since the last reset (``VmHWM``), in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current RSS (Linux >= 4.0)


def held_bytes(trainer) -> int:
    """Bytes of this rank's parameters, gradients and optimizer state (local shards of DTensors)."""
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    tensors = {}
    for p in trainer.module.parameters():
        for t in (p, p.grad):
            if t is not None:
                tensors[local(t).data_ptr()] = local(t)
    for state in trainer.optimizer.state.values():
        for t in state.values():
            if torch.is_tensor(t) and t.numel() > 1:
                tensors[local(t).data_ptr()] = local(t)
    return sum(t.numel() * t.element_size() for t in tensors.values())


def worker(args: argparse.Namespace) -> None:
    """One configuration, on every rank; rank 0 writes the results (all ranks' figures) to ``args.out``."""
    from learner import distributed, fsdp
    from learner.snapshots import SnapshotStore
    from learner.step import PolicyTrainer

    ctx = distributed.init("cpu", timeout_s=900)
    torch.set_num_threads(max(1, (os.cpu_count() or 1) // ctx.world))
    model = llama(args.size)
    sharded = ctx.parallel
    if sharded:
        fsdp.shard(model, device="cpu", world=ctx.world, bf16=not args.fsdp_fp32)
    trainer = PolicyTrainer(model, torch.optim.AdamW(model.parameters(), lr=1e-6),
                            LossConfig().resolved(clip_eps=0.2, max_new_tokens=8), pad_id=0, ctx=ctx,
                            bf16=sharded and not args.fsdp_fp32)
    mine = {"setup": rss()}
    reset_peak()
    if not ctx.is_main:
        trainer.serve()
        mine.update(peak=rss("VmHWM"), held=held_bytes(trainer))
        distributed.gather(ctx, mine)
        distributed.shutdown(ctx)
        return
    started = time.perf_counter()
    trainer.step(records())  # the first step: AdamW's moments are made in it, so its peak is the run's
    mine.update(step_s=time.perf_counter() - started, peak_step=rss("VmHWM"), held=held_bytes(trainer))
    with tempfile.TemporaryDirectory() as tmp:
        store = SnapshotStore(Path(tmp), job_id=1)
        reset_peak()
        started = time.perf_counter()
        manifest = store.write(trainer.full_state(), 1)
        mine.update(snapshot_s=time.perf_counter() - started, peak_snapshot=rss("VmHWM"),
                    snapshot_bytes=manifest.total_bytes)
    trainer.release()
    ranks = distributed.gather(ctx, mine)
    Path(args.out).write_text(json.dumps({"ranks": ranks, "world": ctx.world}))
    distributed.shutdown(ctx)


def run_configuration(size: str, world: int, fsdp_fp32: bool, out: Path) -> dict:
    here, env = str(Path(__file__).resolve()), dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1)
                                                                                         // world)))
    argv = [here, "--worker", "--size", size, "--out", str(out)] + (["--fsdp-fp32"] if fsdp_fp32 else [])
    cmd = [sys.executable, *argv] if world == 1 else \
        [str(Path(sys.executable).parent / "torchrun"), "--standalone", "--nproc-per-node", str(world), *argv]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        _, err = proc.communicate(timeout=900)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.communicate()
        raise SystemExit(f"{size} on {world} rank(s) took more than 900 s") from None
    if proc.returncode != 0:
        raise SystemExit(f"{size} on {world} rank(s) failed:\n{err[-3000:]}")
    return json.loads(out.read_text())


def available() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", default=",".join(SIZES), help=f"comma-separated, of {', '.join(SIZES)}")
    parser.add_argument("--fsdp-fp32", action="store_true", help="FSDP without bf16 mixed precision")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--size", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"unknown size {unknown[0]!r}; choose among {', '.join(SIZES)}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            need = parameter_count(size) * 24  # 16 bytes of state, the snapshot's bytes and chunks
            if need > available() / 2:
                print(f"{size}: skipped, needs about {need / GB:.1f} GB, {available() / GB:.1f} GB available")
                continue
            for world in (1, 2):
                started = time.perf_counter()
                result = run_configuration(size, world, args.fsdp_fp32, Path(tmp) / f"{size}-{world}.json")
                rows.append((size, world, result, time.perf_counter() - started))
    print_table(rows, bf16=not args.fsdp_fp32)


def print_table(rows: list, *, bf16: bool) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="learner memory per rank (GB) and snapshot time (s), the first step on 8 x 16 tokens, AdamW")
    for name in ("model", "parallel", "theory /rank", "held /rank", "RSS set-up", "peak step r0",
                 "peak other ranks", "step s", "snapshot s", "snapshot peak", "held / theory", "wall s"):
        table.add_column(name, justify="left" if name in ("model", "parallel") else "right")
    for size, world, result, wall in rows:
        r0, others = result["ranks"][0], result["ranks"][1:]
        theory = parameter_count(size) * 16 / world
        mode = "1 process (a DDP rank), fp32" if world == 1 else f"FSDP {world} ranks, {'bf16 mp' if bf16 else 'fp32'}"
        table.add_row(f"{size} ({parameter_count(size) / 1e6:.0f}M)", mode, f"{theory / GB:.2f}",
                      f"{r0['held'] / GB:.2f}", f"{r0['setup'] / GB:.2f}", f"{r0['peak_step'] / GB:.2f}",
                      f"{max(o['peak'] for o in others) / GB:.2f}" if others else "-", f"{r0['step_s']:.1f}",
                      f"{r0['snapshot_s']:.1f}", f"{r0['peak_snapshot'] / GB:.2f}", f"{r0['held'] / theory:.2f}",
                      f"{wall:.0f}")
    Console(width=180).print(table)


if __name__ == "__main__":
    main()

"""The learner's side of scripts/gpu_smoke_torch.py: the learner in bf16 autocast (fp32 master weights, its
log-probs of the engine's completions, GRPO steps), snapshots installed into the HF engine as an agent installs them,
and FSDP2 (one step sharded with world size 1, a DCP checkpoint written, disturbed, read back and read whole)."""

from __future__ import annotations

import contextlib
import gc
import os
import time
from collections.abc import Callable
from typing import Any

from gpu_smoke_support import GiB, WeightsDigest, digest, digesting, engine_digest, free_port, peak, reset_peak, sync


def learner_checks(smoke: Any) -> None:
    """The learner section of a ``Run`` (its device, sizes, state and checks)."""
    import torch

    from learner.batch import collate, token_logprobs
    from learner.policy import build_policy
    from learner.snapshots import SnapshotStore

    dev, bf16_autocast = smoke.device, not smoke.args.cpu

    def build() -> str:
        records = smoke.records()
        smoke.state["records"] = records
        started = time.perf_counter()
        trainer, tokenizer = build_policy(smoke.spec(), device=dev, bf16=bf16_autocast,
                                          micro_batch=smoke.sizes.micro_batch)
        smoke.state["trainer"], smoke.state["pad"] = trainer, tokenizer.pad_token_id
        dtypes = sorted({str(p.dtype) for p in trainer.module.parameters()})
        return (f"build_policy {time.perf_counter() - started:.2f}s, {len(records)} records from the engine, "
                f"parameters {', '.join(dtypes)}, bf16 autocast {bf16_autocast}")

    def master_fp32() -> str:
        dtypes = sorted({str(p.dtype) for p in smoke.state["trainer"].module.parameters()})
        assert dtypes == ["torch.float32"], (
            f"the learner's parameters are {', '.join(dtypes)}: the checkpoint's dtype (bf16) became the master "
            "weights' and AdamW's (learner/step.py and learner/fsdp.py keep fp32 master weights)")
        return "fp32 master weights from a bf16 checkpoint"

    def agreement() -> str:
        trainer = smoke.state["trainer"]
        batch = collate(smoke.state["records"][:16], pad_id=smoke.state["pad"]).to(dev)
        trainer.model.eval()
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if bf16_autocast else contextlib.nullcontext()
        with torch.no_grad(), autocast:
            logp = token_logprobs(trainer.model, batch)
        diff = (logp - batch.behaviour_logp).abs() * batch.token_mask
        tokens = float(batch.token_mask.sum())
        return (f"over {tokens:.0f} tokens of 16 completions: max |learner - engine| {float(diff.max()):.2e}, "
                f"mean {float(diff.sum()) / tokens:.2e} (engine in its checkpoint dtype, learner "
                f"{'bf16 autocast' if bf16_autocast else 'fp32'})")

    def step(n: int) -> Callable[[], str]:
        def run() -> str:
            trainer = smoke.state["trainer"]
            reset_peak(dev)
            sync(dev)
            started = time.perf_counter()
            result = trainer.step(smoke.state["records"])
            sync(dev)
            seconds = time.perf_counter() - started
            assert result.grad_norm > 0 and torch.isfinite(torch.tensor(result.loss)), result
            return (f"{result.sequences} sequences, {result.tokens} learning tokens, micro-batch "
                    f"{smoke.sizes.micro_batch}: {seconds:.2f}s ({result.tokens / seconds:,.0f} tokens/s), "
                    f"{peak(dev)}, loss {result.loss:.4f}, grad norm {result.grad_norm:.3g}")
        return run

    def publish(version: int) -> Callable[[], str]:
        def run() -> str:
            store = smoke.state.setdefault("store", SnapshotStore(smoke.root / "snapshots", job_id=1, dtype="bf16"))
            h = WeightsDigest(smoke.bf16)
            started = time.perf_counter()
            manifest = store.write(digesting(smoke.state["trainer"].full_state(), h), version)
            seconds = time.perf_counter() - started
            smoke.state[f"v{version}"], smoke.state[f"v{version}-digest"] = manifest, h.hexdigest()
            full = manifest.full or manifest
            return (f"{manifest.kind}, {manifest.total_bytes / 2**20:.2f} MiB (full payload "
                    f"{full.total_bytes / 2**20:.1f} MiB, {len(full.chunks)} chunks) in {seconds:.2f}s")
        return run

    smoke.checks.run("trainer", "learner: build_policy on the 0.5B model", build, needs=["big-tps"])
    smoke.checks.run("fp32", "learner: fp32 master weights (bf16 only in autocast)", master_fp32, needs=["trainer"])
    smoke.checks.run("agree", "learner vs HF engine log-probs on the engine's completions", agreement,
                    needs=["trainer"])
    smoke.checks.run("step1", "learner: GRPO step 1 (warm-up), 0.5B, bf16 autocast", step(1), needs=["trainer"])
    smoke.checks.run("v1", "snapshot v1 written (bf16)", publish(1), needs=["step1"])
    smoke.checks.run("step2", "learner: GRPO step 2, 0.5B, bf16 autocast", step(2), needs=["step1"])
    smoke.checks.run("v2", "snapshot v2 written (a lossless delta expected)", publish(2), needs=["step2", "v1"])


def installs_checks(smoke: Any) -> None:
    """The installs section of a ``Run`` (its device, sizes, state and checks)."""
    from dataplane.broadcast.store import read_version, version_dir
    from dataplane.snapshot import ordered_chunks
    from worker_agent.weights import rebuild

    dev = smoke.device

    def install(version: int) -> Callable[[], str]:
        def run() -> str:
            engine, store = smoke.state["big-engine"], smoke.state["store"]
            sync(dev)
            started = time.perf_counter()
            manifest, chunks = read_version(version_dir(store.root, version))  # what fetch_chunks would get
            ordered = ordered_chunks(manifest, chunks)  # every chunk and the whole payload verified
            fetched = time.perf_counter()
            held = rebuild(manifest, ordered, smoke.state.get("held"))
            rebuilt = time.perf_counter()
            engine.load_weights(held.tensors())
            sync(dev)
            seconds = time.perf_counter() - started
            smoke.state["held"] = held
            ours, theirs = engine_digest(engine, smoke.bf16), smoke.state[f"v{version}-digest"]
            assert held.manifest.sha256 == (store.manifest(version).full or store.manifest(version)).sha256
            assert ours == theirs, f"engine weights {ours[:12]}... are not the learner's {theirs[:12]}..."
            if version == 2:
                assert manifest.kind == "delta", "v2 was published full, not as a delta"
                assert theirs != smoke.state["v1-digest"], "v2 holds v1's weights: the step changed nothing"
            smoke.state[f"install{version}_s"] = seconds
            return (f"{manifest.kind} of {manifest.total_bytes / 2**20:.2f} MiB: read+verify "
                    f"{fetched - started:.2f}s, {'delta applied' if manifest.kind == 'delta' else 'as is'} "
                    f"{rebuilt - fetched:.2f}s, install {seconds:.2f}s in all; engine sha256 {ours[:16]} = "
                    "learner's")
        return run

    def against_load() -> str:
        load = smoke.state["load_s"]
        full, delta = smoke.state["install1_s"], smoke.state["install2_s"]
        return (f"full install {full:.2f}s, delta install {delta:.2f}s, fresh engine load {load:.2f}s "
                f"({load / full:.1f}x and {load / delta:.1f}x the installs)")

    smoke.checks.run("install1", "hf engine: full snapshot v1 installed, weights hashed equal to the learner's",
                    install(1), needs=["v1", "big-engine"])
    smoke.checks.run("install2", "hf engine: lossless delta v2 installed, weights hashed equal to the learner's",
                    install(2), needs=["v2", "install1"])
    smoke.checks.run("timing", "hf engine: install against a fresh engine load", against_load,
                    needs=["install1", "install2", "big-engine"])


def fsdp_checks(smoke: Any) -> None:
    """The FSDP section of a ``Run`` (its device, sizes, state and checks)."""
    import torch
    import torch.distributed as dist

    from learner import fsdp
    from learner.checkpoint import Checkpoint, CheckpointStore
    from learner.distributed import DistContext
    from learner.policy import build_policy
    from learner.step import PolicyTrainer

    dev = smoke.device
    smoke.state.pop("trainer", None)  # the plain learner's memory goes back first
    gc.collect()
    if dev.startswith("cuda"):
        torch.cuda.empty_cache()

    def shard() -> str:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        backend = "nccl" if dev.startswith("cuda") else "gloo"
        extra = {"device_id": torch.device("cuda:0")} if backend == "nccl" else {}
        dist.init_process_group(backend, rank=0, world_size=1, **extra)
        spec = smoke.spec()
        plain, _ = build_policy(spec, device=dev, bf16=not smoke.args.cpu, micro_batch=smoke.sizes.micro_batch)
        model = fsdp.shard(plain.module, device=dev, world=1, bf16=True)
        optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
        trainer = PolicyTrainer(model, optimizer, spec.loss, pad_id=smoke.state["pad"],
                                micro_batch=smoke.sizes.micro_batch, bf16=True, ctx=DistContext(device=dev),
                                max_grad_norm=spec.loss.max_grad_norm)
        assert trainer.sharded
        smoke.state["fsdp"] = trainer
        reset_peak(dev)
        sync(dev)
        started = time.perf_counter()
        result = trainer.step(smoke.state["records"])
        sync(dev)
        seconds = time.perf_counter() - started
        kinds = sorted({type(p).__name__ for p in model.parameters()})
        dtypes = sorted({str(p.dtype) for p in model.parameters()})
        return (f"{dist.get_backend()} world {dist.get_world_size()}, parameters {', '.join(kinds)} "
                f"{', '.join(dtypes)}; one step of {result.sequences} sequences {seconds:.2f}s (first step, "
                f"warm-up included), {peak(dev)}, grad norm {result.grad_norm:.3g}")

    def dcp() -> str:
        trainer = smoke.state["fsdp"]
        store = CheckpointStore(smoke.root / "checkpoints")
        before = digest(trainer.full_state(), torch.float32)
        moments = {k: v["exp_avg"].full_tensor().float().sum().item()
                   for k, v in trainer.optimizer.state_dict()["state"].items()}
        sync(dev)
        started = time.perf_counter()
        store.save(Checkpoint(version=1, **trainer.checkpoint_state(store, 1), rng={}, trained_entry_ids=[],
                              job={}))
        sync(dev)
        saved = time.perf_counter() - started
        ckpt = store.load()
        path = store.sharded_path(ckpt)
        size = sum(f.stat().st_size for f in path.rglob("*") if f.is_file())
        with torch.no_grad():  # disturb weights and moments: the load must bring both back
            for p in trainer.module.parameters():
                p.to_local().add_(0.5)
            for value in trainer.optimizer.state.values():
                value["exp_avg"].to_local().zero_()
        assert digest(trainer.full_state(), torch.float32) != before
        started = time.perf_counter()
        trainer.load_state(ckpt.model, ckpt.optimizer, sharded=path)
        sync(dev)
        loaded = time.perf_counter() - started
        assert digest(trainer.full_state(), torch.float32) == before, "the weights read back are not those written"
        again = {k: v["exp_avg"].full_tensor().float().sum().item()
                 for k, v in trainer.optimizer.state_dict()["state"].items()}
        assert again == moments, "the optimizer's moments read back are not those written"
        started = time.perf_counter()
        whole = fsdp.whole_model(path)  # what an export of the checkpoint reads, in one process
        exported = time.perf_counter() - started
        whole_digest = digest(((k, v) for k, v in whole.items() if k != "lm_head.weight"), torch.float32)
        assert whole_digest == before, "the checkpoint read whole is not the trained model"
        return (f"{size / GiB:.2f} GiB in {path.name}: written {saved:.2f}s, read back {loaded:.2f}s, weights "
                f"and AdamW moments equal; read whole (export) {exported:.2f}s, equal")

    try:
        smoke.checks.run("fsdp", f"FSDP2 world 1 on {'NCCL' if dev.startswith('cuda') else 'gloo'}: one GRPO step, "
                        "0.5B, bf16 mixed precision", shard, needs=["trainer"])
        smoke.checks.run("dcp", "FSDP2: DCP checkpoint written, disturbed, read back, read whole", dcp,
                        needs=["fsdp"])
    finally:
        smoke.state.pop("fsdp", None)
        if dist.is_initialized():
            dist.destroy_process_group()

"""The GPU path that needs only torch and transformers, one PASS/FAIL/SKIP line each (issue 33).

What it checks, on CUDA (``--cpu``: the same code on the CPU at toy sizes, to shake out bugs for free):

- models built locally, no download: the demo's tiny Llama (``echo2-learner init-model``'s defaults) and a
  Qwen2-0.5B-shaped model with random weights (hidden 896, 24 layers, 14 heads, 2 KV heads, vocabulary 151936,
  tied embeddings) saved in bf16 in Hugging Face layout, as released checkpoints are;
- the HF engine (``worker_agent/engines/hf.py``): n > 1 with seeds (same seed, same samples; another seed or the
  next call, others), its log-probs against a full forward, greedy n = 3; tokens/s at the demo's shape (16 prompts
  x 8, 2 new tokens) and at 64 prompts x 8 with 512 new tokens;
- the learner (``learner.policy.build_policy``, ``PolicyTrainer``) in bf16 autocast: fp32 master weights, the
  log-probs it scores the engine's completions with, two GRPO steps on those 512 completions (time, peak memory);
- snapshots (``learner.snapshots.SnapshotStore``, bf16): version 1 full, version 2 a lossless delta, each
  verified and installed into the HF engine as an agent installs it (``worker_agent.weights.rebuild``,
  ``HeldWeights.tensors``, ``Engine.load_weights``), the engine's weights hashed equal to the learner's; the
  install timed against a fresh engine load;
- FSDP2 (``learner.fsdp.shard``) with world size 1 on NCCL (gloo with ``--cpu``): one step, a DCP checkpoint
  written as the learner writes it, weights disturbed, read back and hashed equal, and read whole as an export
  reads it.

The checks that need vLLM or the whole site (Django, Redis, Celery) are printed as SKIP with the reason when
those are not importable. Ends with ``N passed, M failed, K skipped``; exits 1 when a check failed.
``--log PATH`` (default ``$OUT/gpu-smoke.log`` when ``OUT`` is set) keeps a copy of everything printed.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import hashlib
import importlib.util
import os
import random
import socket
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GiB = 2**30

# The checks of issue 33 that need vLLM (scripts/gpu_smoke.py runs them where vLLM is installed).
VLLM_CHECKS = (
    "vllm: engine built from a thread, n>1 with seeds",
    "vllm: log-probs against the HF engine (max abs difference per token)",
    "vllm: full snapshot installed in place, weights hashed equal to the learner's",
    "vllm: lossless delta installed in place, weights hashed equal to the learner's",
    "vllm: install timed against a fresh engine load",
    "vllm: tokens/s against the HF engine (demo shape; 64 prompts x 8, 512 new tokens)",
    "vllm: a bf16 export (echo2-learner export) loads and generates",
)
SITE_MODULES = ("django", "redis", "celery", "channels", "daphne", "websockets")


@dataclass(frozen=True)
class Sizes:
    """What the run builds and generates: the GPU sizes of issue 33, or toy ones for ``--cpu``."""

    hidden: int
    intermediate: int
    layers: int
    heads: int
    kv_heads: int
    vocab: int
    prompts: int  # the long generation: prompts x group, new_tokens each
    group: int
    new_tokens: int
    micro_batch: int
    demo_prompts: int = 16  # the demo's job: R = 128 = 16 prompts x 8, 2 new tokens
    demo_group: int = 8
    demo_new_tokens: int = 2


GPU = Sizes(hidden=896, intermediate=4864, layers=24, heads=14, kv_heads=2, vocab=151936, prompts=64, group=8,
            new_tokens=512, micro_batch=32)
CPU = Sizes(hidden=64, intermediate=128, layers=2, heads=4, kv_heads=2, vocab=1000, prompts=4, group=4,
            new_tokens=16, micro_batch=4, demo_prompts=4, demo_group=4)


class Checks:
    def __init__(self, deadline_s: float | None = None) -> None:
        self.passed = self.failed = self.skipped = 0
        self.done: set[str] = set()
        self.deadline = time.monotonic() + deadline_s if deadline_s else None

    def run(self, key: str, name: str, test: Callable[[], str | None], *, needs: Iterable[str] = ()) -> bool:
        missing = [k for k in needs if k not in self.done]
        if missing:
            self.skip(name, f"needs {', '.join(missing)}, which did not pass")
            return False
        if self.deadline is not None and time.monotonic() > self.deadline:
            self.skip(name, "out of time (--deadline-s)")
            return False
        started = time.perf_counter()
        try:
            detail = test()
        except Exception as err:  # report and go on: one line per check
            self.failed += 1
            print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
            return False
        self.passed += 1
        self.done.add(key)
        took = time.perf_counter() - started
        print(f"PASS {name}" + (f" ({detail})" if detail else "") + f" [{took:.1f}s]", flush=True)
        return True

    def skip(self, name: str, reason: str) -> None:
        self.skipped += 1
        print(f"SKIP {name}: {reason}", flush=True)


class Tee:
    """Write to the terminal and to a log file."""

    def __init__(self, stream, log) -> None:  # noqa: ANN001 - text streams
        self.stream, self.log = stream, log

    def write(self, text: str) -> int:
        self.log.write(text)
        self.log.flush()
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()
        self.log.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


# --- helpers ------------------------------------------------------------------------------------------------------


def sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def reset_peak(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()


def peak(device: str) -> str:
    import torch

    if device.startswith("cuda"):
        return f"peak {torch.cuda.max_memory_allocated() / GiB:.2f} GiB allocated"
    return "peak n/a on CPU"


class WeightsDigest:
    """A sha256 of named tensors as published, whatever order they come in: each tensor's name, dtype, shape and
    bytes (floating ones cast to ``dtype``, the snapshot dtype, on the CPU) hashed alone, then the names in order."""

    def __init__(self, dtype) -> None:  # noqa: ANN001 - a torch dtype
        self.dtype, self.parts = dtype, {}

    def add(self, name: str, tensor) -> None:  # noqa: ANN001
        import torch

        cast = tensor.detach().to("cpu")
        if cast.is_floating_point():
            cast = cast.to(self.dtype)
        cast = cast.contiguous()
        h = hashlib.sha256(f"{cast.dtype}|{tuple(cast.shape)}|".encode())
        h.update(cast.reshape(-1).view(torch.uint8).numpy())
        self.parts[name] = h.hexdigest()

    def hexdigest(self) -> str:
        return hashlib.sha256("".join(f"{k}={v};" for k, v in sorted(self.parts.items())).encode()).hexdigest()


def digesting(pairs: Iterable[tuple[str, Any]], into: WeightsDigest) -> Iterator[tuple[str, Any]]:
    """Pass (name, tensor) pairs through (to the snapshot store), hashing each on the way."""
    for name, tensor in pairs:
        into.add(name, tensor)
        yield name, tensor


def digest(pairs: Iterable[tuple[str, Any]], dtype) -> str:  # noqa: ANN001
    into = WeightsDigest(dtype)
    for name, tensor in pairs:
        into.add(name, tensor)
    return into.hexdigest()


def engine_digest(engine, dtype) -> str:  # noqa: ANN001
    """The engine model's weights hashed as the learner's are (state-dict order, a tied tensor once)."""
    from learner.fsdp import full_tensors

    return digest(full_tensors(engine.model), dtype)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count_tokens(groups) -> int:  # noqa: ANN001
    return sum(len(c.completion_ids) for group in groups for c in group)


def build_qwen2(directory: Path, *, alphabet: str, sizes: Sizes, device: str) -> tuple[Path, int]:
    """A Qwen2-shaped causal LM with random weights and the task's character tokenizer, saved in bf16 (as released
    checkpoints are) in Hugging Face layout; returns (directory, parameter count). The vocabulary is the real
    model's: ids past the tokenizer's decode to nothing (the engine drops them from the text, not the ids)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from learner.tiny import build_tokenizer

    tokenizer = build_tokenizer(alphabet)
    config = Qwen2Config(vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=sizes.intermediate,
                         num_hidden_layers=sizes.layers, num_attention_heads=sizes.heads,
                         num_key_value_heads=sizes.kv_heads, max_position_embeddings=4096, tie_word_embeddings=True,
                         bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    torch.manual_seed(0)
    with torch.device(device):
        model = Qwen2ForCausalLM(config)
    model = model.to(torch.bfloat16)
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    count = sum(p.numel() for p in model.parameters())
    model.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    del model
    return directory, count


# --- the run ------------------------------------------------------------------------------------------------------


class Run:
    """The checks in order; later ones use what earlier ones built (and SKIP when that failed)."""

    def __init__(self, args: argparse.Namespace, checks: Checks) -> None:
        import torch

        self.args, self.checks = args, checks
        self.device = "cpu" if args.cpu else "cuda"
        self.sizes = CPU if args.cpu else GPU
        self.root = Path(args.workdir or tempfile.mkdtemp(prefix="echo2-gpu-smoke-"))
        self.root.mkdir(parents=True, exist_ok=True)
        self.bf16 = torch.bfloat16
        self.state: dict[str, Any] = {}

    # -- models
    def models(self) -> None:
        from dataplane.tasks import build_task
        from learner.tiny import build_tiny_model

        task = build_task({"name": "arithmetic", "max_operand": 4})  # the demo's task
        self.state["task"] = task

        def tiny() -> str:
            path = build_tiny_model(self.root / "tiny", alphabet=task.alphabet)  # init-model's defaults
            self.state["tiny"] = path
            return f"{path.name}: Llama, hidden 64, 2 layers, fp32"

        def qwen() -> str:
            path, count = build_qwen2(self.root / "qwen2-0.5b", alphabet=task.alphabet, sizes=self.sizes,
                                      device=self.device)
            self.state["big"] = path
            size = sum(f.stat().st_size for f in path.glob("*.safetensors"))
            s = self.sizes
            return (f"{count / 1e6:.1f}M parameters, hidden {s.hidden}, {s.layers} layers, {s.heads} heads, "
                    f"{s.kv_heads} KV heads, vocabulary {s.vocab}, tied; {size / 2**20:.0f} MiB of bf16 safetensors")

        self.checks.run("tiny", "build: the demo's tiny model (echo2-learner init-model), HF layout", tiny)
        self.checks.run("big", "build: a Qwen2-0.5B-shaped model, random weights, bf16, HF layout", qwen)

    # -- the HF engine
    def engine(self) -> None:
        import torch

        from worker_agent.engines import make_engine
        from worker_agent.engines.base import SamplingParams

        dev, s, task = self.device, self.sizes, self.state.get("task")
        prompts = [p.text for p in task.sample_prompts(random.Random(0), 4)] if task else []
        sampled = SamplingParams(max_new_tokens=6, temperature=1.0, top_p=0.9)

        def seeds() -> str:
            a = make_engine("hf", str(self.state["tiny"]), device=dev, seed=1)
            b = make_engine("hf", str(self.state["tiny"]), device=dev, seed=1)
            c = make_engine("hf", str(self.state["tiny"]), device=dev, seed=2)
            first = a.generate(prompts, n=8, params=sampled)
            assert [len(g) for g in first] == [8] * len(prompts), [len(g) for g in first]
            for group in first:
                for comp in group:
                    assert len(comp.completion_ids) == len(comp.logprobs) >= 1
                    assert all(lp <= 0 for lp in comp.logprobs), comp.logprobs
            ids = [[comp.completion_ids for comp in g] for g in first]
            assert any(len({tuple(x) for x in g}) > 1 for g in ids), "the 8 samples of every prompt are the same"
            same = b.generate(prompts, n=8, params=sampled)
            assert ids == [[comp.completion_ids for comp in g] for g in same], "the same seed sampled differently"
            other = c.generate(prompts, n=8, params=sampled)
            assert ids != [[comp.completion_ids for comp in g] for g in other], "seeds 1 and 2 sampled the same"
            again = a.generate(prompts, n=8, params=sampled)
            assert ids != [[comp.completion_ids for comp in g] for g in again], "two calls sampled the same"
            worst = 0.0
            for group in first:
                for comp in group:
                    full = torch.tensor([comp.prompt_ids + comp.completion_ids], device=dev)
                    with torch.no_grad():
                        logits = a.model(input_ids=full).logits[0, len(comp.prompt_ids) - 1:-1].float()
                    expected = torch.log_softmax(logits, -1).gather(1, full[0, len(comp.prompt_ids):, None])
                    worst = max(worst, max(abs(x - y) for x, y in zip(comp.logprobs, expected.squeeze(1).tolist(),
                                                                       strict=True)))
            assert worst < 1e-3, f"log-probs {worst:.1e} from a full forward's"
            greedy = a.generate(prompts, n=3, params=SamplingParams(max_new_tokens=4, temperature=0.0))
            assert all(g[0] == g[1] == g[2] for g in greedy)
            return (f"{len(prompts)} prompts x 8: same seed same samples, seed 2 and the next call differ; log-probs "
                    f"within {worst:.1e} of a full forward (fp32); greedy n=3 one completion thrice")

        def throughput(key: str, prompts_n: int, group: int, new_tokens: int, repeat: int) -> Callable[[], str]:
            def measure() -> str:
                engine = self.state[key]
                params = SamplingParams(max_new_tokens=new_tokens, temperature=1.0, top_p=1.0)
                texts = [p.text for p in task.sample_prompts(random.Random(1), prompts_n)]
                engine.generate(texts, n=group, params=SamplingParams(max_new_tokens=2))  # warm up
                reset_peak(dev)
                tokens, seconds, groups = 0, 0.0, None
                for _ in range(repeat):
                    sync(dev)
                    started = time.perf_counter()
                    groups = engine.generate(texts, n=group, params=params)
                    sync(dev)
                    seconds += time.perf_counter() - started
                    tokens += count_tokens(groups)
                self.state[f"{key}-groups"] = (texts, groups)
                return (f"{prompts_n} prompts x {group}, {new_tokens} new tokens: {tokens / seconds:,.0f} tokens/s, "
                        f"{repeat * prompts_n * group / seconds:,.1f} sequences/s ({tokens} tokens in {seconds:.2f}s, "
                        f"{peak(dev)})")
            return measure

        def load_tiny() -> str:
            started = time.perf_counter()
            self.state["tiny-engine"] = make_engine("hf", str(self.state["tiny"]), device=dev, seed=0)
            return f"{time.perf_counter() - started:.2f}s"

        def load_big() -> str:
            sync(dev)
            started = time.perf_counter()
            engine = make_engine("hf", str(self.state["big"]), device=dev, seed=0)
            sync(dev)
            self.state["load_s"] = seconds = time.perf_counter() - started
            self.state["big-engine"] = engine
            dtype = next(engine.model.parameters()).dtype
            return f"fresh engine load {seconds:.2f}s, weights {dtype}, on {engine.device}"

        self.checks.run("seeds", "hf engine: n=8 with seeds, log-probs, greedy (tiny model)", seeds, needs=["tiny"])
        self.checks.run("tiny-engine", "hf engine: tiny model loaded", load_tiny, needs=["tiny"])
        self.checks.run("demo-tps", "hf engine tokens/s, demo shape, tiny model",
                        throughput("tiny-engine", s.demo_prompts, s.demo_group, s.demo_new_tokens, 5),
                        needs=["tiny-engine"])
        self.checks.run("big-engine", "hf engine: 0.5B model loaded (from_pretrained)", load_big, needs=["big"])
        self.checks.run("big-demo-tps", "hf engine tokens/s, demo shape, 0.5B model",
                        throughput("big-engine", s.demo_prompts, s.demo_group, s.demo_new_tokens, 5),
                        needs=["big-engine"])
        self.checks.run("big-tps", f"hf engine tokens/s, {s.prompts} prompts x {s.group}, {s.new_tokens} new tokens, "
                        "0.5B model", throughput("big-engine", s.prompts, s.group, s.new_tokens, 1),
                        needs=["big-engine"])

    # -- records from the engine's completions
    def records(self):  # noqa: ANN201
        from dataplane.records import Trajectory

        texts, groups = self.state["big-engine-groups"]
        rng = random.Random(0)
        out = []
        for i, (text, group) in enumerate(zip(texts, groups, strict=True)):
            rewards = [float(rng.random() < 0.5) for _ in group]  # a random-weight model earns no reward of its own
            rewards[0], rewards[1] = 1.0, 0.0  # every group learns something
            for comp, reward in zip(group, rewards, strict=True):
                out.append(Trajectory(job_id=1, lease_id=f"lease-{i}", group_id=f"group-{i}", prompt=text,
                                      prompt_ids=comp.prompt_ids, completion=comp.text,
                                      completion_ids=comp.completion_ids, logprobs=comp.logprobs, reward=reward,
                                      version=0))
        return out

    def spec(self):  # noqa: ANN201
        from dataplane.jobs import JobSpec

        s = self.sizes
        return JobSpec(name="gpu-smoke", model_dir=str(self.state["big"]),
                       task={"name": "arithmetic", "max_operand": 4}, batch_trajectories=s.prompts * s.group,
                       group_size=s.group, learning_rate=1e-6, max_new_tokens=s.new_tokens)

    # -- the learner, snapshots and installs
    def learner(self) -> None:
        import torch

        from learner.batch import collate, token_logprobs
        from learner.policy import build_policy
        from learner.snapshots import SnapshotStore

        dev, bf16_autocast = self.device, not self.args.cpu

        def build() -> str:
            records = self.records()
            self.state["records"] = records
            started = time.perf_counter()
            trainer, tokenizer = build_policy(self.spec(), device=dev, bf16=bf16_autocast,
                                              micro_batch=self.sizes.micro_batch)
            self.state["trainer"], self.state["pad"] = trainer, tokenizer.pad_token_id
            dtypes = sorted({str(p.dtype) for p in trainer.module.parameters()})
            return (f"build_policy {time.perf_counter() - started:.2f}s, {len(records)} records from the engine, "
                    f"parameters {', '.join(dtypes)}, bf16 autocast {bf16_autocast}")

        def master_fp32() -> str:
            dtypes = sorted({str(p.dtype) for p in self.state["trainer"].module.parameters()})
            assert dtypes == ["torch.float32"], (
                f"the learner's parameters are {', '.join(dtypes)}: the checkpoint's dtype (bf16) became the master "
                "weights' and AdamW's (learner/step.py and learner/fsdp.py keep fp32 master weights)")
            return "fp32 master weights from a bf16 checkpoint"

        def agreement() -> str:
            trainer = self.state["trainer"]
            batch = collate(self.state["records"][:16], pad_id=self.state["pad"]).to(dev)
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
                trainer = self.state["trainer"]
                reset_peak(dev)
                sync(dev)
                started = time.perf_counter()
                result = trainer.step(self.state["records"])
                sync(dev)
                seconds = time.perf_counter() - started
                assert result.grad_norm > 0 and torch.isfinite(torch.tensor(result.loss)), result
                return (f"{result.sequences} sequences, {result.tokens} learning tokens, micro-batch "
                        f"{self.sizes.micro_batch}: {seconds:.2f}s ({result.tokens / seconds:,.0f} tokens/s), "
                        f"{peak(dev)}, loss {result.loss:.4f}, grad norm {result.grad_norm:.3g}")
            return run

        def publish(version: int) -> Callable[[], str]:
            def run() -> str:
                store = self.state.setdefault("store", SnapshotStore(self.root / "snapshots", job_id=1, dtype="bf16"))
                h = WeightsDigest(self.bf16)
                started = time.perf_counter()
                manifest = store.write(digesting(self.state["trainer"].full_state(), h), version)
                seconds = time.perf_counter() - started
                self.state[f"v{version}"], self.state[f"v{version}-digest"] = manifest, h.hexdigest()
                full = manifest.full or manifest
                return (f"{manifest.kind}, {manifest.total_bytes / 2**20:.2f} MiB (full payload "
                        f"{full.total_bytes / 2**20:.1f} MiB, {len(full.chunks)} chunks) in {seconds:.2f}s")
            return run

        self.checks.run("trainer", "learner: build_policy on the 0.5B model", build, needs=["big-tps"])
        self.checks.run("fp32", "learner: fp32 master weights (bf16 only in autocast)", master_fp32, needs=["trainer"])
        self.checks.run("agree", "learner vs HF engine log-probs on the engine's completions", agreement,
                        needs=["trainer"])
        self.checks.run("step1", "learner: GRPO step 1 (warm-up), 0.5B, bf16 autocast", step(1), needs=["trainer"])
        self.checks.run("v1", "snapshot v1 written (bf16)", publish(1), needs=["step1"])
        self.checks.run("step2", "learner: GRPO step 2, 0.5B, bf16 autocast", step(2), needs=["step1"])
        self.checks.run("v2", "snapshot v2 written (a lossless delta expected)", publish(2), needs=["step2", "v1"])

    def installs(self) -> None:
        from dataplane.broadcast.store import read_version, version_dir
        from dataplane.snapshot import ordered_chunks
        from worker_agent.weights import rebuild

        dev = self.device

        def install(version: int) -> Callable[[], str]:
            def run() -> str:
                engine, store = self.state["big-engine"], self.state["store"]
                sync(dev)
                started = time.perf_counter()
                manifest, chunks = read_version(version_dir(store.root, version))  # what fetch_chunks would get
                ordered = ordered_chunks(manifest, chunks)  # every chunk and the whole payload verified
                fetched = time.perf_counter()
                held = rebuild(manifest, ordered, self.state.get("held"))
                rebuilt = time.perf_counter()
                engine.load_weights(held.tensors())
                sync(dev)
                seconds = time.perf_counter() - started
                self.state["held"] = held
                ours, theirs = engine_digest(engine, self.bf16), self.state[f"v{version}-digest"]
                assert held.manifest.sha256 == (store.manifest(version).full or store.manifest(version)).sha256
                assert ours == theirs, f"engine weights {ours[:12]}... are not the learner's {theirs[:12]}..."
                if version == 2:
                    assert manifest.kind == "delta", "v2 was published full, not as a delta"
                    assert theirs != self.state["v1-digest"], "v2 holds v1's weights: the step changed nothing"
                self.state[f"install{version}_s"] = seconds
                return (f"{manifest.kind} of {manifest.total_bytes / 2**20:.2f} MiB: read+verify "
                        f"{fetched - started:.2f}s, {'delta applied' if manifest.kind == 'delta' else 'as is'} "
                        f"{rebuilt - fetched:.2f}s, install {seconds:.2f}s in all; engine sha256 {ours[:16]} = "
                        "learner's")
            return run

        def against_load() -> str:
            load = self.state["load_s"]
            full, delta = self.state["install1_s"], self.state["install2_s"]
            return (f"full install {full:.2f}s, delta install {delta:.2f}s, fresh engine load {load:.2f}s "
                    f"({load / full:.1f}x and {load / delta:.1f}x the installs)")

        self.checks.run("install1", "hf engine: full snapshot v1 installed, weights hashed equal to the learner's",
                        install(1), needs=["v1", "big-engine"])
        self.checks.run("install2", "hf engine: lossless delta v2 installed, weights hashed equal to the learner's",
                        install(2), needs=["v2", "install1"])
        self.checks.run("timing", "hf engine: install against a fresh engine load", against_load,
                        needs=["install1", "install2", "big-engine"])

    def fsdp(self) -> None:
        import torch
        import torch.distributed as dist

        from learner import fsdp
        from learner.checkpoint import Checkpoint, CheckpointStore
        from learner.distributed import DistContext
        from learner.policy import build_policy
        from learner.step import PolicyTrainer

        dev = self.device
        self.state.pop("trainer", None)  # the plain learner's memory goes back first
        gc.collect()
        if dev.startswith("cuda"):
            torch.cuda.empty_cache()

        def shard() -> str:
            os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
            backend = "nccl" if dev.startswith("cuda") else "gloo"
            extra = {"device_id": torch.device("cuda:0")} if backend == "nccl" else {}
            dist.init_process_group(backend, rank=0, world_size=1, **extra)
            spec = self.spec()
            plain, _ = build_policy(spec, device=dev, bf16=not self.args.cpu, micro_batch=self.sizes.micro_batch)
            model = fsdp.shard(plain.module, device=dev, world=1, bf16=True)
            optimizer = torch.optim.AdamW(model.parameters(), lr=spec.learning_rate)
            trainer = PolicyTrainer(model, optimizer, spec.loss, pad_id=self.state["pad"],
                                    micro_batch=self.sizes.micro_batch, bf16=True, ctx=DistContext(device=dev),
                                    max_grad_norm=spec.loss.max_grad_norm)
            assert trainer.sharded
            self.state["fsdp"] = trainer
            reset_peak(dev)
            sync(dev)
            started = time.perf_counter()
            result = trainer.step(self.state["records"])
            sync(dev)
            seconds = time.perf_counter() - started
            kinds = sorted({type(p).__name__ for p in model.parameters()})
            dtypes = sorted({str(p.dtype) for p in model.parameters()})
            return (f"{dist.get_backend()} world {dist.get_world_size()}, parameters {', '.join(kinds)} "
                    f"{', '.join(dtypes)}; one step of {result.sequences} sequences {seconds:.2f}s (first step, "
                    f"warm-up included), {peak(dev)}, grad norm {result.grad_norm:.3g}")

        def dcp() -> str:
            trainer = self.state["fsdp"]
            store = CheckpointStore(self.root / "checkpoints")
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
            self.checks.run("fsdp", f"FSDP2 world 1 on {'NCCL' if dev.startswith('cuda') else 'gloo'}: one GRPO step, "
                            "0.5B, bf16 mixed precision", shard, needs=["trainer"])
            self.checks.run("dcp", "FSDP2: DCP checkpoint written, disturbed, read back, read whole", dcp,
                            needs=["fsdp"])
        finally:
            self.state.pop("fsdp", None)
            if dist.is_initialized():
                dist.destroy_process_group()

    def skips(self) -> None:
        vllm = importlib.util.find_spec("vllm") is not None
        if not vllm:
            why = f" ({self.args.why_no_vllm})" if self.args.why_no_vllm else ""
            for name in VLLM_CHECKS:
                self.checks.skip(name, f"vLLM is not importable here{why}; scripts/gpu_smoke.py runs these where it is")
        else:
            print("INFO vLLM is importable: scripts/gpu_smoke.py runs its checks", flush=True)
        missing = [name for name in SITE_MODULES if importlib.util.find_spec(name) is None]
        if missing:
            self.checks.skip("demo job end to end (site, Redis, Celery, learner, one agent), reward rising",
                             f"{', '.join(missing)} not importable here, and no Redis server")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="Run on the CPU at toy sizes (a dry run of the script).")
    parser.add_argument("--workdir", help="Where models, snapshots and checkpoints go (default: a new temp dir).")
    parser.add_argument("--log", default=os.path.join(os.environ["OUT"], "gpu-smoke.log") if os.environ.get("OUT")
                        else None, help="Also write everything printed here (default: $OUT/gpu-smoke.log).")
    parser.add_argument("--deadline-s", type=float, default=None,
                        help="Skip the checks not started this many seconds after the start (the summary still comes).")
    parser.add_argument("--why-no-vllm", help="Said in the SKIP lines of the vLLM checks when vLLM is missing.")
    args = parser.parse_args()
    if args.log:
        log = open(args.log, "a", buffering=1)  # noqa: SIM115 - open for the whole run
        sys.stdout, sys.stderr = Tee(sys.stdout, log), Tee(sys.stderr, log)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    started = time.perf_counter()

    import torch
    import transformers

    print(f"python {sys.version.split()[0]}, torch {torch.__version__} (CUDA {torch.version.cuda}), transformers "
          f"{transformers.__version__}", flush=True)
    checks = Checks(args.deadline_s)
    if not args.cpu and not torch.cuda.is_available():
        checks.skip("every GPU check", "no CUDA GPU here (--cpu runs the same code on the CPU)")
        print(f"0 passed, 0 failed, {checks.skipped} skipped")
        return 0
    if not args.cpu:
        props = torch.cuda.get_device_properties(0)
        print(f"GPU {props.name}, {props.total_memory / GiB:.0f} GiB, capability {props.major}.{props.minor}, "
              f"{props.multi_processor_count} SMs", flush=True)
        torch.backends.cuda.matmul.allow_tf32 = False  # fp32 stays fp32: the engines' defaults
    run = Run(args, checks)
    print(f"work directory {run.root}", flush=True)
    for section in (run.models, run.engine, run.learner, run.installs, run.fsdp, run.skips):
        try:
            section()
        except Exception as err:  # a section's own code (not a check) broke: say so, go on with the next
            checks.failed += 1
            print(f"FAIL {section.__name__}: {type(err).__name__}: {err}", flush=True)
    print(f"{checks.passed} passed, {checks.failed} failed, {checks.skipped} skipped "
          f"({time.perf_counter() - started:.0f}s)", flush=True)
    return 1 if checks.failed else 0


if __name__ == "__main__":
    sys.exit(main())

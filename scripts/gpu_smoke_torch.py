"""The GPU path that needs only torch and transformers, one PASS/FAIL/SKIP line each.

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
import importlib.util
import os
import random
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

# The checks that need vLLM (scripts/gpu_smoke.py runs them where vLLM is installed).
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

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its parts, beside it (run as a script)

from gpu_smoke_support import (  # noqa: E402
    CPU,
    GPU,
    Checks,
    GiB,
    Tee,
    build_qwen2,
    count_tokens,
    peak,
    reset_peak,
    sync,
)
from gpu_smoke_training import fsdp_checks, installs_checks, learner_checks  # noqa: E402

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
        learner_checks(self)

    def installs(self) -> None:
        installs_checks(self)

    def fsdp(self) -> None:
        fsdp_checks(self)

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

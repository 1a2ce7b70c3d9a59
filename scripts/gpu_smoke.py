"""The vLLM engine's first-GPU-run checks, one PASS/FAIL line each (run by ``scripts/gpu-smoke.sh``).

Phase 1, fp32 and eager, on a tiny model: the engine built from a worker thread as the agent builds it; n = 3 at
temperature 0.7, top-p 0.9 with a stop string, token and log-prob lengths equal and log-probs within 2e-3 of the HF
engine's log-softmax; seeds that differ from call to call; greedy n = 3 as three copies of the HF engine's greedy
completion; an install of perturbed weights (every tensor loaded, the prefix cache reset) that changes the greedy
output, and the original weights restoring it exactly; a snapshot with missing weights refused with nothing
installed; the host memory an install takes. Phase 2 does the same in bf16 with CUDA graphs on a larger model
(log-probs within 5e-2 of the HF engine's in bf16). Then a snapshot of that model exported in bf16 as a Hugging
Face directory (``echo2-learner export``) must load in vLLM as is and generate.

Without CUDA or without vLLM it prints one SKIP line per check, with the reason, and exits 0; otherwise it exits 1
when any check failed. The GPU checks that need no vLLM (the HF engine, the learner in bf16, FSDP2 on NCCL, snapshot
installs into the HF engine) are ``scripts/gpu_smoke_torch.py``'s.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import gc
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

PROMPTS = ["3+4=", "12+5=", "9+9=", "7+0="]
STOP = "1"


class Checks:
    def __init__(self) -> None:
        self.passed = self.failed = 0

    def run(self, name: str, test: Callable[[], str | None]) -> None:
        try:
            detail = test()
        except Exception as err:  # report and go on: one line per check
            self.failed += 1
            print(f"FAIL {name}: {type(err).__name__}: {err}", flush=True)
        else:
            self.passed += 1
            print(f"PASS {name}" + (f" ({detail})" if detail else ""), flush=True)


def ids(groups) -> list[list[int]]:
    return [c.completion_ids for group in groups for c in group]


def host_rss_bytes() -> int:
    """Resident memory of this process and its descendants (the vLLM engine and worker processes)."""
    import psutil

    me = psutil.Process()
    total = me.memory_info().rss
    for child in me.children(recursive=True):
        with contextlib.suppress(psutil.NoSuchProcess):
            total += child.memory_info().rss
    return total


def peak_rss_during(work: Callable[[], None]) -> tuple[int, int]:
    """(RSS before, peak RSS while ``work`` runs), sampled every 20 ms."""
    before = peak = host_rss_bytes()
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, host_rss_bytes())
            time.sleep(0.02)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        work()
    finally:
        done.set()
        sampler.join()
    return before, max(peak, host_rss_bytes())


def phase(checks: Checks, label: str, model_dir: Path, *, dtype: str, eager: bool, logprob_tol: float) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from worker_agent.engines import make_engine
    from worker_agent.engines.base import SamplingParams
    from worker_agent.engines.vllm import MULTIPROC_ENV, VLLMEngine

    print(f"-- {label}: {model_dir.name}, dtype {dtype}, {'eager' if eager else 'CUDA graphs'}", flush=True)
    torch_dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[dtype]
    engine: VLLMEngine | None = None

    def build() -> str:
        nonlocal engine
        started = time.perf_counter()
        with concurrent.futures.ThreadPoolExecutor(1) as pool:  # the agent builds in asyncio.to_thread
            engine = pool.submit(make_engine, "vllm", str(model_dir), seed=0, dtype=dtype, gpu_memory_utilization=0.3,
                                 max_model_len=128, enforce_eager=eager).result()
        return f"{time.perf_counter() - started:.1f}s, {MULTIPROC_ENV}={os.environ.get(MULTIPROC_ENV)}"

    checks.run(f"{label}: engine built from a thread", build)
    if engine is None:
        return
    hf = make_engine("hf", str(model_dir), device="cuda", seed=0)
    hf.model.to(torch_dtype)
    sampled = SamplingParams(max_new_tokens=8, temperature=0.7, top_p=0.9)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)

    def sampling() -> str:
        groups = engine.generate_ids([engine.encode_prompt(p) for p in PROMPTS], n=3, params=sampled, stop=[STOP])
        assert [len(g) for g in groups] == [3] * len(PROMPTS), [len(g) for g in groups]
        worst = 0.0
        for group in groups:
            for c in group:
                assert len(c.completion_ids) == len(c.logprobs) >= 1, (c.completion_ids, c.logprobs)
                assert STOP not in c.text[:-1], f"text goes on after the stop string: {c.text!r}"
                ids = torch.tensor([c.prompt_ids + c.completion_ids], device="cuda")
                with torch.no_grad():
                    logits = hf.model(input_ids=ids).logits[0, len(c.prompt_ids) - 1:-1].float()
                expected = torch.log_softmax(logits, -1).gather(1, ids[0, len(c.prompt_ids):, None]).squeeze(1)
                worst = max(worst, max(abs(a - b) for a, b in zip(c.logprobs, expected.tolist(), strict=True)))
        assert worst <= logprob_tol, f"log-probs {worst:.2e} from the HF engine's (tolerance {logprob_tol:g})"
        return f"worst log-prob difference {worst:.1e}"

    def seeds_differ() -> str:
        first = engine.generate(PROMPTS, n=3, params=sampled)
        second = engine.generate(PROMPTS, n=3, params=sampled)
        assert first != second, "two calls sampled the same completions"
        return None

    def greedy_copies() -> str:
        groups = engine.generate(PROMPTS, n=3, params=greedy)
        assert all(len(g) == 3 and g[0] == g[1] == g[2] for g in groups)
        if dtype == "float32":
            ours = [g[0].completion_ids for g in groups]
            theirs = [g[0].completion_ids for g in hf.generate(PROMPTS, n=1, params=greedy)]
            assert ours == theirs, f"greedy differs from the HF engine's: {ours} != {theirs}"
        return None

    checks.run(f"{label}: n=3, temperature 0.7, top-p 0.9, stop {STOP!r}", sampling)
    checks.run(f"{label}: consecutive calls sample differently", seeds_differ)
    checks.run(f"{label}: greedy n=3 is one completion three times", greedy_copies)

    original = AutoModelForCausalLM.from_pretrained(str(model_dir)).state_dict()
    snapshot_bytes = sum(t.numel() * t.element_size() for t in original.values())

    def install() -> str:
        before = engine.generate(PROMPTS, n=1, params=greedy)
        generator = torch.Generator().manual_seed(0)
        perturbed = {k: v + 0.5 * torch.randn(v.shape, generator=generator) for k, v in original.items()}
        rss_before, rss_peak = peak_rss_during(lambda: engine.load_weights(perturbed))
        info = dict(engine.last_install)
        assert info["loaded"] == len(original), f"loaded {info['loaded']} of {len(original)} tensors"
        assert info["prefix_cache_resets"] >= 1
        after = engine.generate(PROMPTS, n=1, params=greedy)
        assert [g[0].logprobs for g in after] != [g[0].logprobs for g in before], "the install changed nothing"
        engine.load_weights(original)
        restored = engine.generate(PROMPTS, n=1, params=greedy)
        assert ids(restored) == ids(before), "the original weights did not restore the greedy output"
        drift = max(abs(a - b) for r, o in zip(restored, before, strict=True)
                    for a, b in zip(r[0].logprobs, o[0].logprobs, strict=True))
        grew = rss_peak - rss_before
        print(f"INFO {label}: install of {snapshot_bytes / 2**20:.1f} MiB: host RSS +{grew / 2**20:.1f} MiB at peak "
              f"(agent and vLLM processes), write {info.get('write_s', 0):.2f}s, load {info['load_s']:.2f}s, "
              f"{info['parameters']} vLLM parameters", flush=True)
        if snapshot_bytes >= 64 * 2**20:  # below that, allocator noise hides the snapshot
            assert grew < 2 * snapshot_bytes, f"an install took {grew / snapshot_bytes:.1f}x the snapshot in host RAM"
        return (f"{info['loaded']} tensors, prefix cache reset in {info['prefix_cache_resets']} call(s), restored "
                f"log-probs within {drift:.1e}")

    def missing_refused() -> str:
        before = engine.generate(PROMPTS, n=1, params=greedy)
        try:
            engine.load_weights({k: v for k, v in original.items() if "layers.0.mlp" not in k})
        except ValueError as err:
            assert "missing" in str(err)
        else:
            raise AssertionError("a snapshot with missing weights was installed")
        assert ids(engine.generate(PROMPTS, n=1, params=greedy)) == ids(before)
        return None

    checks.run(f"{label}: perturbed install changes greedy output, original restores it", install)
    checks.run(f"{label}: snapshot with missing weights refused, nothing installed", missing_refused)


def exported(checks: Checks, root: Path, model_dir: Path) -> None:
    """A snapshot exported as a Hugging Face directory (dataplane/export.py, bf16) is what vLLM loads as is."""
    from transformers import AutoModelForCausalLM

    from learner.export import export_version
    from learner.snapshots import SnapshotStore
    from worker_agent.engines import make_engine
    from worker_agent.engines.base import SamplingParams

    def load() -> str:
        store = SnapshotStore(root / "snapshots" / "job1", job_id=1)
        store.write_base(model_dir)
        store.write(AutoModelForCausalLM.from_pretrained(model_dir), 1)
        export_version(root / "snapshots", 1, root / "exported", version=1, dtype="bf16")
        engine = make_engine("vllm", str(root / "exported"), seed=0, dtype="bfloat16", gpu_memory_utilization=0.3,
                             max_model_len=128, enforce_eager=True)
        completion = engine.generate(["3+4="], n=1, params=SamplingParams(max_new_tokens=3, temperature=0.0))[0][0]
        return f"generated {completion.completion_ids}"

    checks.run("export: a bf16 export loads in vLLM as is and generates", load)


PHASE_CHECKS = ("engine built from a thread", f"n=3, temperature 0.7, top-p 0.9, stop {STOP!r}",
                "consecutive calls sample differently", "greedy n=3 is one completion three times",
                "perturbed install changes greedy output, original restores it",
                "snapshot with missing weights refused, nothing installed")


def skip_all(reason: str, args: argparse.Namespace) -> int:
    """One SKIP line per check this script would run, with ``reason``; exits 0."""
    labels = ["fp32 eager"] + ([] if args.skip_bf16 else ["bf16 CUDA graphs"])
    names = [f"{label}: {check}" for label in labels for check in PHASE_CHECKS]
    names += [] if args.skip_bf16 else ["export: a bf16 export loads in vLLM as is and generates"]
    for name in names:
        print(f"SKIP {name}: {reason}")
    print(f"0 passed, 0 failed, {len(names)} skipped")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--skip-bf16", action="store_true", help="Only phase 1 (fp32, eager).")
    parser.add_argument("--hidden", type=int, default=1024, help="Hidden size of phase 2's model (head size 64).")
    args = parser.parse_args()

    import torch
    import transformers

    print(f"python {sys.version.split()[0]}, torch {torch.__version__}, transformers {transformers.__version__}")
    if not torch.cuda.is_available():
        return skip_all("no CUDA GPU here", args)
    try:
        import vllm
    except ImportError as err:
        return skip_all(f"vLLM is not importable ({err}): pip install '.[vllm]'; scripts/gpu_smoke_torch.py runs the "
                        "checks that need only torch and transformers", args)
    print(f"vllm {vllm.__version__}, GPU {torch.cuda.get_device_name(0)}", flush=True)

    from dataplane.tasks import build_task
    from learner.tiny import build_tiny_model

    alphabet = build_task({"name": "arithmetic"}).alphabet
    root = Path(tempfile.mkdtemp(prefix="echo2-gpu-smoke-"))
    checks = Checks()
    tiny = build_tiny_model(root / "tiny", alphabet=alphabet, hidden=256, layers=2, heads=4)
    phase(checks, "fp32 eager", tiny, dtype="float32", eager=True, logprob_tol=2e-3)
    gc.collect()  # the first engine's processes go with it
    torch.cuda.empty_cache()
    if not args.skip_bf16:
        larger = build_tiny_model(root / "larger", alphabet=alphabet, hidden=args.hidden, layers=4,
                                  heads=args.hidden // 64)
        phase(checks, "bf16 CUDA graphs", larger, dtype="bfloat16", eager=False, logprob_tol=5e-2)
        gc.collect()
        torch.cuda.empty_cache()
        exported(checks, root, larger)
    print(f"{checks.passed} passed, {checks.failed} failed")
    return 1 if checks.failed else 0


if __name__ == "__main__":  # vLLM spawns its processes: they import this module and must not run it
    sys.exit(main())

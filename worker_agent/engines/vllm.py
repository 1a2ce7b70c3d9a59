"""vLLM engine: fast batched sampling on a CUDA GPU, with in-place weight installs (``pip install echo2[vllm]``).

Written and pinned against vLLM 0.34 (``TESTED_VERSIONS`` in :mod:`.vllm_support`; other versions are refused or
warned about). The model lives in vLLM's worker processes; we reach it through ``LLM.collective_rpc`` and a worker
extension (:class:`WeightLoader`, named by ``worker_extension_cls``).

Installs: the snapshot is written once to a safetensors file (``install_dir``, default the system's temporary
directory; ``/dev/shm`` keeps it in memory) and only its path crosses to the workers, which read it tensor by
tensor and hand the tensors to the worker's own ``reload_weights`` -- vLLM's reload path: its config context, the
layer-wise reload that re-runs the post-load processing of quantized and repacked layers, and its log of weights
not loaded. Sending the tensors themselves through ``collective_rpc`` would pass the whole snapshot through vLLM's
message serialiser (2-3x the model in host memory). Before anything is sent, the snapshot's names are checked
against the base checkpoint's (vLLM only logs weights it did not load), and after it the prefix cache is reset
until vLLM says it is (KV blocks cached under the old weights must not serve the new ones). An install that fails
after the workers started loading leaves the engine refusing to generate until an install succeeds.

Sampling: token-id prompts; greedy and seeds as :mod:`.base` and :mod:`.seeds` say (one greedy sample replicated
``n`` times; one disjoint block of seeds per prompt and call). Log-probs: ``logprobs=0`` returns the sampled token's,
and ``logprobs_mode="raw_logprobs"`` makes them the raw policy's (before temperature and top-p), like
:class:`~worker_agent.engines.hf.HFEngine`'s.

Processes: vLLM starts its engine process with ``VLLM_WORKER_MULTIPROC_METHOD`` (``fork`` by default). The agent
builds engines in a worker thread (``asyncio.to_thread``), and forking a multi-threaded process copies locks held by
other threads, so we set ``spawn`` unless the variable is set already.

``vllm`` is imported inside the class, so this module imports (and the agent runs its HF engine) on machines
without it.

LoRA jobs (docs/lora.md): an engine built with ``enable_lora=True`` (the agent's ``ECHO2_VLLM_MAX_LORA_RANK`` at
least the job's rank) applies each version's adapter as vLLM's own LoRA: the adapter written as a PEFT directory,
then every request of that version carries ``LoRARequest(f"v{version}", version, directory)``; the base weights
stay as loaded. Written against vLLM's documented LoRA API (``vllm.lora.request.LoRARequest``,
``LLM.generate(lora_request=)``) and not run here: no GPU on the machine where it was written.
"""

from __future__ import annotations

import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from dataplane.chat import PLAIN, PromptFormat
from dataplane.lora import LoraSpec

from .base import Completion, Engine, SamplingParams
from .seeds import SeedStream
from .vllm_support import (
    TESTED_VERSIONS,
    check_snapshot_keys,
    checkpoint_keys,
    reset_prefix_cache,
    sampling_kwargs,
    version_status,
)

log = logging.getLogger("echo2.agent")

MULTIPROC_ENV = "VLLM_WORKER_MULTIPROC_METHOD"
LORA_RANK_ENV = "ECHO2_VLLM_MAX_LORA_RANK"  # > 0: the engine serves LoRA jobs up to this rank (enable_lora)


class VLLMUnavailable(RuntimeError):
    """vLLM is missing, too old, or cannot run here (no CUDA)."""


class WeightLoader:
    """Worker extension mixed into every vLLM worker process (``worker_extension_cls``); ``self`` is the worker."""

    def echo2_install(self, path: str) -> dict[str, int]:
        """Load the safetensors file at ``path`` through the worker's ``reload_weights``; returns how many tensors
        the model consumed and how many parameters it has."""
        from safetensors import safe_open

        consumed: list[str] = []

        def tensors() -> Iterator[tuple[str, Any]]:
            with safe_open(path, framework="pt", device="cpu") as handle:
                for name in handle.keys():  # noqa: SIM118  (safe_open handles are not iterable)
                    consumed.append(name)
                    yield name, handle.get_tensor(name)

        self.reload_weights(weights_iterator=tensors())  # type: ignore[attr-defined]  # the vLLM worker's
        model = self.model_runner.model  # type: ignore[attr-defined]
        return {"loaded": len(consumed), "parameters": sum(1 for _ in model.parameters())}


def _import_vllm():
    os.environ.setdefault(MULTIPROC_ENV, "spawn")  # before vLLM reads it: never fork from the agent's threads
    try:
        import vllm
    except ImportError as err:
        raise VLLMUnavailable(f"the vllm engine needs vLLM {TESTED_VERSIONS[0]} (< {TESTED_VERSIONS[1]}): "
                              f"pip install 'echo2[vllm]' ({err})") from None
    status = version_status(vllm.__version__)
    if status == "older":
        raise VLLMUnavailable(f"vLLM {vllm.__version__} is older than the tested {TESTED_VERSIONS[0]}: "
                              "pip install 'echo2[vllm]'")
    if status != "tested":
        log.warning("vLLM %s is outside the tested line [%s, %s); run scripts/gpu-smoke.sh on this machine",
                    vllm.__version__, *TESTED_VERSIONS)
    return vllm


class VLLMEngine(Engine):
    def __init__(self, model_dir: str, *, seed: int | None = None, gpu_memory_utilization: float = 0.85,
                 dtype: str = "auto", stop: list[str] | None = None, install_dir: str | None = None,
                 prompt_format: PromptFormat = PLAIN, **engine_kwargs: Any) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer

        self.expected_keys, self.tied_head = checkpoint_keys(model_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)  # prompts become ids here (Engine.encode_prompt)
        self.prompt_format = prompt_format
        self.stop = list(stop or [])
        self.seeds = SeedStream(seed) if seed is not None else None
        self.install_dir = install_dir
        self.last_install: dict[str, Any] = {}
        self._partial: str | None = None  # why the weights may be a mix of two snapshots
        engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        lora_rank = int(os.environ.get(LORA_RANK_ENV) or 0)  # vLLM sizes its LoRA buffers when it starts
        if lora_rank > 0 and "enable_lora" not in engine_kwargs:
            engine_kwargs.update(enable_lora=True, max_lora_rank=lora_rank)
        self.lora_enabled = bool(engine_kwargs.get("enable_lora"))
        self._lora: Any = None  # the LoRARequest of the adapter generated with (None: the base's weights)
        self._lora_dirs: list[tempfile.TemporaryDirectory] = []
        self.llm = vllm.LLM(model=model_dir, tokenizer=model_dir, seed=seed if seed is not None else 0, dtype=dtype,
                            gpu_memory_utilization=gpu_memory_utilization,
                            worker_extension_cls=f"{__name__}.WeightLoader", **engine_kwargs)

    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        return self.generate_ids([self.encode_prompt(p) for p in prompts], n=n, params=params)

    def generate_ids(self, prompt_ids: list[list[int]], *, n: int, params: SamplingParams,
                     stop: list[str] | None = None) -> list[list[Completion]]:
        """Sample from token ids (multi-turn episodes continue a context without re-tokenizing it)."""
        if self._partial is not None:
            raise RuntimeError(f"the engine's weights may be partly installed ({self._partial}); install a snapshot")
        from vllm import SamplingParams as VSamplingParams

        stops = self.stop + list(stop or [])
        requests = [VSamplingParams(**sampling_kwargs(
            params, n=n, stop=stops, seed=self.seeds.take(n) if self.seeds and not params.greedy else None))
            for _ in prompt_ids]
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], requests, use_tqdm=False,
                                    lora_request=self._lora)
        groups = []
        for ids, out in zip(prompt_ids, outputs, strict=True):
            group = []
            for sample in out.outputs:
                tokens = list(sample.token_ids)
                logprobs = [step[token].logprob for token, step in zip(tokens, sample.logprobs or [], strict=True)]
                group.append(Completion(prompt_ids=list(ids), completion_ids=tokens, logprobs=logprobs,
                                        text=self.tokenizer.decode(tokens, skip_special_tokens=True)))
            groups.append(group * n if params.greedy else group)
        return groups

    def load_adapter(self, tensors: dict, spec: LoraSpec, *, version: int) -> None:
        """Write ``version``'s adapter as a PEFT directory (adapter_model.safetensors and adapter_config.json) and
        generate under it from now on; vLLM loads it at the first request that names it. The two newest
        directories are kept (the previous one may still be loading), older ones removed."""
        from peft import LoraConfig
        from safetensors.torch import save_file
        from vllm.lora.request import LoRARequest

        if not self.lora_enabled:
            raise ValueError(f"this vLLM engine was built without LoRA; a LoRA job needs it: start the agent with "
                             f"{LORA_RANK_ENV}={spec.rank} or more")
        directory = tempfile.TemporaryDirectory(prefix=f"echo2-adapter-v{version}-", dir=self.install_dir)
        save_file({k: v.detach().cpu().contiguous() for k, v in tensors.items()},
                  str(Path(directory.name) / "adapter_model.safetensors"), metadata={"format": "pt"})
        LoraConfig(**{**spec.peft_config(), "lora_dropout": 0.0}).save_pretrained(directory.name)
        self._lora = LoRARequest(f"v{version}", version, directory.name)
        self.adapter_version = version
        self._lora_dirs.append(directory)
        while len(self._lora_dirs) > 2:
            self._lora_dirs.pop(0).cleanup()

    def load_weights(self, tensors: dict) -> None:
        """Install a full snapshot: checked against the base checkpoint's names, written to one file that the workers
        load through vLLM's reload path, then the prefix cache reset. ``last_install`` tells what it took."""
        from safetensors.torch import save_file

        check_snapshot_keys(tensors, expected=self.expected_keys, tied_head=self.tied_head)
        started = time.perf_counter()
        seen: set[int] = set()
        state = {}
        for name, tensor in tensors.items():  # safetensors refuses shared storage (a tied head)
            tensor = tensor.detach().cpu().contiguous()
            if tensor.data_ptr() in seen:
                tensor = tensor.clone()
            seen.add(tensor.data_ptr())
            state[name] = tensor
        handle, path = tempfile.mkstemp(prefix="echo2-snapshot-", suffix=".safetensors", dir=self.install_dir)
        os.close(handle)
        try:
            save_file(state, path)
            del state
            written = time.perf_counter()
            self.load_weights_file(path, expected_tensors=len(tensors))
        finally:
            Path(path).unlink(missing_ok=True)
        self.last_install["write_s"] = written - started

    def load_weights_file(self, path: str, *, expected_tensors: int | None = None) -> None:
        """Install the safetensors snapshot at ``path`` (its names checked first): every worker reads the file itself,
        so nothing but the path crosses vLLM's message queue."""
        from safetensors import safe_open

        with safe_open(path, framework="numpy") as handle:
            names = list(handle.keys())
        check_snapshot_keys(names, expected=self.expected_keys, tied_head=self.tied_head)
        started = time.perf_counter()
        self._partial = f"an install from {path} failed"
        results = self.llm.collective_rpc("echo2_install", args=(path,))
        for result in results:
            if result["loaded"] != len(names):
                raise RuntimeError(f"a vLLM worker loaded {result['loaded']} of the snapshot's {len(names)} tensors")
        loaded = time.perf_counter()
        resets = reset_prefix_cache(self.llm.reset_prefix_cache)
        self._partial = None
        self.last_install = {"tensors": expected_tensors or len(names), "loaded": results[0]["loaded"],
                             "parameters": results[0]["parameters"], "workers": len(results),
                             "load_s": loaded - started, "prefix_cache_resets": resets}

"""vLLM engine: fast batched sampling on a CUDA GPU, with in-place weight installs (``pip install echo2[vllm]``).

Written against vLLM's V1 engine (>= 0.8.3; the only engine from 0.10 on), where the model lives in
worker processes, so the in-process ``llm.llm_engine.model_executor.driver_worker`` path of older
versions no longer exists. New weights reach the workers through ``LLM.collective_rpc`` and a worker
extension (:class:`WeightLoader`, named by ``worker_extension_cls``) whose method calls the model's
own ``load_weights`` -- the pattern of vLLM's RLHF examples. The prefix cache is reset after each
install: cached KV blocks were computed by the old weights.

Log-probs: ``SamplingParams(logprobs=0)`` returns the log-prob of each sampled token. We ask for
``logprobs_mode="raw_logprobs"`` (before temperature and top-p) where vLLM supports it, so they are the
raw policy's, like :class:`~worker_agent.engines.hf.HFEngine`'s; older versions report them as they are.

``vllm`` is imported inside the class, so this module imports (and the agent runs its HF engine)
on machines without it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from .base import Completion, Engine, SamplingParams

MIN_VERSION = "0.8.3"


class VLLMUnavailable(RuntimeError):
    """vLLM is missing, too old, or cannot run here (no CUDA)."""


class WeightLoader:
    """Worker extension mixed into every vLLM worker process (``worker_extension_cls``)."""

    def echo2_load_weights(self, weights: list[tuple[str, Any]]) -> int:
        model = self.model_runner.model  # type: ignore[attr-defined]  # provided by the vLLM worker
        device = next(model.parameters()).device
        loaded = model.load_weights(weights=((name, tensor.to(device)) for name, tensor in weights))
        return len(loaded) if loaded is not None else len(weights)


def _import_vllm():
    try:
        import vllm
    except ImportError as err:
        raise VLLMUnavailable(f"the vllm engine needs vLLM >= {MIN_VERSION}: pip install 'echo2[vllm]' ({err})"
                              ) from None
    return vllm


class VLLMEngine(Engine):
    def __init__(self, model_dir: str, *, seed: int | None = None, gpu_memory_utilization: float = 0.85,
                 dtype: str = "auto", stop: list[str] | None = None, **engine_kwargs: Any) -> None:
        vllm = _import_vllm()
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import EngineArgs

        fields = {f.name for f in dataclasses.fields(EngineArgs)}
        if "worker_extension_cls" not in fields:
            raise VLLMUnavailable(f"vLLM {vllm.__version__} cannot install weights in place; need >= {MIN_VERSION}")
        if "logprobs_mode" in fields:
            engine_kwargs.setdefault("logprobs_mode", "raw_logprobs")
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.stop = list(stop or [])
        self.seed = seed
        self._calls = 0
        self.llm = vllm.LLM(model=model_dir, tokenizer=model_dir, seed=seed if seed is not None else 0, dtype=dtype,
                            gpu_memory_utilization=gpu_memory_utilization,
                            worker_extension_cls=f"{__name__}.WeightLoader", **engine_kwargs)

    def encode_prompt(self, prompt: str) -> list[int]:
        """The same ids as the HF engine: the tokenizer's, with a BOS in front when it has one."""
        ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        bos = self.tokenizer.bos_token_id
        if bos is not None and (not ids or ids[0] != bos):
            ids = [bos, *ids]
        return ids

    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        return self.generate_ids([self.encode_prompt(p) for p in prompts], n=n, params=params)

    def generate_ids(self, prompt_ids: list[list[int]], *, n: int, params: SamplingParams,
                     stop: list[str] | None = None) -> list[list[Completion]]:
        """Sample from token ids (multi-turn episodes continue a context without re-tokenizing it)."""
        from vllm import SamplingParams as VSamplingParams

        self._calls += 1
        sampling = VSamplingParams(
            n=n, temperature=max(params.temperature, 0.0), top_p=params.top_p, max_tokens=params.max_new_tokens,
            logprobs=0, stop=self.stop + list(stop or []), include_stop_str_in_output=True,
            seed=None if self.seed is None else self.seed * 1_000_003 + self._calls,
        )
        outputs = self.llm.generate([{"prompt_token_ids": ids} for ids in prompt_ids], sampling, use_tqdm=False)
        groups = []
        for ids, out in zip(prompt_ids, outputs, strict=True):
            group = []
            for sample in out.outputs:
                tokens = list(sample.token_ids)
                logprobs = [step[token].logprob for token, step in zip(tokens, sample.logprobs or [], strict=True)]
                group.append(Completion(prompt_ids=list(ids), completion_ids=tokens, logprobs=logprobs,
                                        text=self.tokenizer.decode(tokens, skip_special_tokens=True)))
            groups.append(group)
        return groups

    def load_weights(self, tensors: dict) -> None:
        """Install a full snapshot in every worker of the engine, then drop KV cached under the old weights."""
        if not hasattr(self.llm, "collective_rpc"):
            raise VLLMUnavailable(f"this vLLM has no LLM.collective_rpc; in-place installs need >= {MIN_VERSION}")
        weights = [(name, tensor.detach().cpu().contiguous()) for name, tensor in tensors.items()]
        self.llm.collective_rpc("echo2_load_weights", args=(weights,))
        self.llm.reset_prefix_cache()

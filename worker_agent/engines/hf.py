"""Torch/transformers engine: batched sampling on CPU or GPU with per-token log-probs.

Works on every transformers the pins allow (``pyproject.toml``; ``scripts/hf-engine-compat.sh`` runs it on one):
the KV cache is passed and read under the name the model's ``forward`` declares, ``cache`` (transformers 5.24 on)
or ``past_key_values`` (before; 5.24 still accepts it with a deprecation warning, until 5.40).
"""

from __future__ import annotations

import inspect

import torch

from dataplane.chat import PLAIN, PromptFormat
from dataplane.lora import LoraSpec, injected_key, is_adapter_key

from .base import Completion, Engine, SamplingParams


def warm_imports(model_dir: str | None = None) -> None:
    """Import transformers' model, tokenizer and generation modules, and ``model_dir``'s architecture."""
    import transformers
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer  # noqa: F401
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    if model_dir is not None:
        model_type = AutoConfig.from_pretrained(model_dir).model_type
        architecture = MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(model_type)
        if architecture:
            getattr(transformers, architecture)  # transformers imports its modeling module lazily


class HFEngine(Engine):
    def __init__(self, model_dir: str, *, device: str | None = None, seed: int | None = None,
                 prompt_format: PromptFormat = PLAIN) -> None:
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # agents log lines, not bars

        self.device = torch.device(device or ("cuda" if torch.cuda.is_available() else "cpu"))
        self.tokenizer = AutoTokenizer.from_pretrained(model_dir)
        self.prompt_format = prompt_format
        self.model = AutoModelForCausalLM.from_pretrained(model_dir).to(self.device).eval()
        self.generator = torch.Generator(device=self.device)
        if seed is not None:
            self.generator.manual_seed(seed)
        if self.tokenizer.pad_token_id is None:
            self.tokenizer.pad_token = self.tokenizer.eos_token
        self.cache_name = cache_argument(self.model)
        self.adapter: LoraSpec | None = None  # injected by the first load_adapter (a LoRA job's)

    def load_weights(self, tensors: dict) -> None:
        state = {k: v.to(self.device) for k, v in tensors.items()}
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        real_missing = [k for k in missing if not k.endswith("lm_head.weight")]  # tied to the embeddings
        if real_missing or unexpected:
            raise ValueError(f"snapshot does not fit the model: missing={real_missing[:3]} unexpected={unexpected[:3]}")

    @torch.no_grad()
    def load_adapter(self, tensors: dict, spec: LoraSpec, *, version: int) -> None:
        """The first adapter is injected into the model in place (PEFT's ``inject_adapter_in_model``: each target
        layer gains lora_A/lora_B beside its unchanged base weight, no dropout); every later one only replaces
        those tensors. The base is never reloaded."""
        if self.adapter is None:
            from peft import LoraConfig, inject_adapter_in_model

            inject_adapter_in_model(LoraConfig(**{**spec.peft_config(), "lora_dropout": 0.0}), self.model)
            self.model.eval()
            self.adapter = spec.model_copy(update={"dropout": 0.0})
        elif spec.model_copy(update={"dropout": 0.0}) != self.adapter:
            raise ValueError(f"v{version}'s adapter settings {spec} are not those the engine holds {self.adapter}")
        try:
            state = {injected_key(name): tensor for name, tensor in tensors.items()}
        except ValueError as err:
            raise ValueError(f"v{version} is not an adapter: {err}") from None
        own = {name: t for name, t in self.model.state_dict().items() if is_adapter_key(name)}
        wrong = sorted(set(state) ^ set(own)) or [k for k, t in state.items() if t.shape != own[k].shape]
        if wrong:
            raise ValueError(f"v{version}'s adapter does not fit the model: {wrong[:3]}")
        for name, tensor in state.items():
            own[name].copy_(tensor)
        self.adapter_version = version

    def generate(self, prompts: list[str], *, n: int, params: SamplingParams) -> list[list[Completion]]:
        return self.generate_ids([self.encode_prompt(p) for p in prompts], n=n, params=params)

    @torch.no_grad()
    def generate_ids(self, prompt_ids: list[list[int]], *, n: int, params: SamplingParams,
                     stop: list[str] | None = None) -> list[list[Completion]]:
        """Sample with a KV cache, token by token, so log-probs are those of the raw policy.

        Starts from token ids, so multi-turn episodes continue a context without re-tokenizing it; a row
        ends at eos or once its text ends with one of ``stop`` (kept in the output, as vLLM does). Greedy
        (``params.greedy``) decodes each prompt once and returns that completion ``n`` times.
        """
        if params.greedy and n > 1:
            return [group * n for group in self.generate_ids(prompt_ids, n=1, params=params, stop=stop)]
        encoded = [list(ids) for ids in prompt_ids for _ in range(n)]
        pad, eos = self.tokenizer.pad_token_id, self.tokenizer.eos_token_id
        width = max(len(e) for e in encoded)
        input_ids = torch.full((len(encoded), width), pad, dtype=torch.long)
        attention = torch.zeros_like(input_ids)
        for row, ids in enumerate(encoded):  # left padding keeps every prompt's last token aligned
            input_ids[row, width - len(ids):] = torch.tensor(ids)
            attention[row, width - len(ids):] = 1
        input_ids, attention = input_ids.to(self.device), attention.to(self.device)
        position_ids = (attention.cumsum(-1) - 1).clamp(min=0)

        batch = len(encoded)
        tokens = torch.empty((batch, 0), dtype=torch.long, device=self.device)
        logps = torch.empty((batch, 0), dtype=torch.float32, device=self.device)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        past = None
        step_ids, step_pos = input_ids, position_ids
        for _ in range(params.max_new_tokens):
            out = self.model(input_ids=step_ids, attention_mask=attention, position_ids=step_pos,
                             use_cache=True, **{self.cache_name: past})
            past = getattr(out, self.cache_name)
            logits = out.logits[:, -1, :].float()
            raw_logp = torch.log_softmax(logits, dim=-1)
            choice = self._sample(logits, params)
            choice = torch.where(done, torch.full_like(choice, pad), choice)
            tokens = torch.cat([tokens, choice[:, None]], dim=1)
            logps = torch.cat([logps, raw_logp.gather(1, choice[:, None])], dim=1)
            done = done | (choice == eos)
            if stop:
                for row in (~done).nonzero().flatten().tolist():
                    text = self.tokenizer.decode(tokens[row].tolist(), skip_special_tokens=True)
                    done[row] = any(text.endswith(s) for s in stop)
            if bool(done.all()):
                break
            attention = torch.cat([attention, torch.ones_like(choice)[:, None]], dim=1)
            step_ids, step_pos = choice[:, None], step_pos[:, -1:] + 1

        results: list[Completion] = []
        for row in range(batch):
            ids, lps = tokens[row].tolist(), logps[row].tolist()
            if eos in ids:  # keep the eos token: the policy learns to stop
                cut = ids.index(eos) + 1
                ids, lps = ids[:cut], lps[:cut]
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
            results.append(Completion(prompt_ids=encoded[row], completion_ids=ids, logprobs=lps, text=text))
        return [results[i * n:(i + 1) * n] for i in range(len(prompt_ids))]

    def _sample(self, logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
        if params.greedy:
            return logits.argmax(dim=-1)
        probs = torch.softmax(logits / params.temperature, dim=-1)
        if params.top_p < 1.0:
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            keep = sorted_probs.cumsum(-1) - sorted_probs < params.top_p
            sorted_probs = sorted_probs * keep
            probs = torch.zeros_like(probs).scatter(1, order, sorted_probs)
        return torch.multinomial(probs, 1, generator=self.generator).squeeze(1)


def cache_argument(model: torch.nn.Module) -> str:
    """The name under which ``model``'s forward takes (and its output returns) the KV cache."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"

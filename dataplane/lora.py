"""LoRA jobs: the job's ``lora`` setting, and what an adapter snapshot is (docs/lora.md).

A job with ``lora.rank > 0`` trains a low-rank adapter (PEFT's LoRA) on its frozen base. Version 0 is still the
base checkpoint; every later version is the adapter alone: a safetensors payload of the adapter's tensors under the
names PEFT saves them with (``adapter_model.safetensors``: ``base_model.model.<module>.lora_A.weight``), published
with the manifest format :data:`ADAPTER_FORMAT`, the adapter's settings in the payload's safetensors metadata
(:data:`METADATA_KEY`), so the payload alone says how to apply it. A few MB whatever the learning rate, where a
full snapshot is the whole model (issue: T_bcast ~ M/Bw).

Plain data only (no torch, no peft): the site validates the setting, the learner and the agents map it to PEFT.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

ADAPTER_FORMAT = "lora-safetensors"
"""The manifest format of an adapter version: a safetensors payload of LoRA tensors (PEFT's names)."""
METADATA_KEY = "echo2.lora"
"""The safetensors metadata key holding the adapter's :class:`LoraSpec` as JSON."""
ADAPTER_NAME = "default"  # PEFT's name of a model's only adapter: in module keys, never in saved names
SAVED_PREFIX = "base_model.model."  # what PEFT's saved names put in front of the model's own module names
LLAMA_QWEN_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
"""Every linear layer of a Llama, Qwen2/3, Mistral or SmolLM block (attention and MLP), as the LoRA-for-RL reports
apply it: attention alone learns markedly less."""
_MODULE_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


class LoraSpec(BaseModel):
    """The job's adapter: ``rank`` 0 (the default) trains the whole model, as every job did before."""

    model_config = ConfigDict(extra="forbid")

    rank: int = Field(default=0, ge=0, le=1024, description="r: the adapter's rank; 0 (the default) trains the "
                      "whole model, no adapter. 8 to 64 are usual.")
    alpha: float | None = Field(default=None, gt=0, le=1e6, allow_inf_nan=False, description="LoRA alpha: the "
                                "update is scaled by alpha / rank; default 2 x rank.")
    dropout: float = Field(default=0.0, ge=0.0, lt=1.0, description="Dropout on the adapter's input while the "
                           "learner trains (engines never apply it); 0 keeps the learner's log-probs those the "
                           "workers sampled with.")
    target_modules: list[str] = Field(
        default_factory=lambda: list(LLAMA_QWEN_TARGETS), min_length=1, max_length=64,
        description="Names (last part) of the linear layers that get an adapter; the default covers Llama, Qwen "
        "and Mistral layouts: " + ", ".join(LLAMA_QWEN_TARGETS) + ".")

    @field_validator("target_modules")
    @classmethod
    def _module_names(cls, value: list[str]) -> list[str]:
        bad = [name for name in value if not _MODULE_NAME.match(name)]
        if bad:
            raise ValueError(f"{bad[0]!r} is not a module name (letters, digits, _ and .)")
        if len(set(value)) != len(value):
            raise ValueError("a module is named twice")
        return value

    @model_validator(mode="after")
    def _alpha_default(self) -> LoraSpec:
        if self.alpha is None and self.rank:
            self.alpha = 2.0 * self.rank
        return self

    @property
    def enabled(self) -> bool:
        return self.rank > 0

    def peft_config(self) -> dict:
        """The keyword arguments of ``peft.LoraConfig`` for this adapter (a causal LM's, no bias trained)."""
        return {"r": self.rank, "lora_alpha": self.alpha, "lora_dropout": self.dropout,
                "target_modules": list(self.target_modules), "bias": "none", "task_type": "CAUSAL_LM"}


def adapter_metadata(spec: LoraSpec) -> dict[str, str]:
    """The safetensors metadata of an adapter payload (values are strings, as safetensors requires)."""
    return {METADATA_KEY: spec.model_dump_json()}


def spec_from_metadata(metadata: Mapping[str, str]) -> LoraSpec:
    """The :class:`LoraSpec` an adapter payload carries; ValueError when it carries none or a bad one."""
    raw = metadata.get(METADATA_KEY)
    if raw is None:
        raise ValueError(f"an adapter payload carries its settings under {METADATA_KEY!r}; this one has none")
    spec = LoraSpec.model_validate(json.loads(raw))
    if not spec.enabled:
        raise ValueError("an adapter payload of rank 0")
    return spec


def is_adapter_key(name: str) -> bool:
    """A LoRA tensor of a model (or of a saved adapter): ``...lora_A...`` or ``...lora_B...``."""
    return ".lora_A." in name or ".lora_B." in name


def saved_name(module_key: str, *, adapter: str = ADAPTER_NAME) -> str:
    """PEFT's saved name of a LoRA tensor of a wrapped model's state dict: the adapter's name dropped
    (``...q_proj.lora_A.default.weight`` -> ``...q_proj.lora_A.weight``), as ``get_peft_model_state_dict`` does."""
    return module_key.replace(f".{adapter}.", ".")


def injected_key(name: str, *, adapter: str = ADAPTER_NAME) -> str:
    """The state-dict key of a saved LoRA tensor in a model with the adapter injected in place (no PeftModel
    wrapper): ``base_model.model.m.q_proj.lora_A.weight`` -> ``m.q_proj.lora_A.default.weight``."""
    bare = name.removeprefix(SAVED_PREFIX)
    for part in (".lora_A.", ".lora_B."):
        if part in bare:
            return bare.replace(part, f"{part}{adapter}.", 1)
    raise ValueError(f"{name!r} is not a LoRA tensor")

"""LoRA jobs on the learner (docs/lora.md): the policy is the frozen base wrapped by PEFT with one trainable adapter.

- :func:`wrap` makes the job's model a ``peft.PeftModel`` (``get_peft_model``): every base parameter frozen
  (``requires_grad=False``), so the optimizer is built over the adapter alone and gradients and AdamW's moments
  exist for it alone. Checkpoints hold the whole wrapped state (the base's frozen tensors too: a resume needs no
  other file).
- :class:`AdapterOff` is the KL reference: the same module with the adapter disabled (PEFT's ``disable_adapter``),
  so a LoRA job keeps no second model in memory.
- :func:`adapter_state` picks a version's publication out of the policy's state: the adapter's tensors under the
  names PEFT saves them with (``adapter_model.safetensors``), what :class:`~learner.snapshots.SnapshotStore`
  publishes for every version after the base.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from dataplane.lora import ADAPTER_NAME, LoraSpec, is_adapter_key, saved_name


def wrap(model: torch.nn.Module, spec: LoraSpec) -> torch.nn.Module:
    """``model`` with the job's adapter injected (PEFT's LoRA, initialised so that the policy starts as the base:
    B = 0), every base parameter frozen. ValueError naming the modules when none of the targets exists."""
    from peft import LoraConfig, get_peft_model

    try:
        return get_peft_model(model, LoraConfig(**spec.peft_config()))
    except ValueError as err:  # PEFT: "Target modules {...} not found in the base model"
        raise ValueError(f"lora.target_modules: {err}") from None


def trainable(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    """The parameters the optimizer updates: the adapter's for a LoRA policy, all of them otherwise."""
    return [p for p in model.parameters() if p.requires_grad]


class AdapterOff(torch.nn.Module):
    """The base policy of a LoRA policy, as a module: its forward is the policy's with the adapter disabled.

    The policy is held outside the module tree (never a submodule), so this reference adds no parameter, no state
    and no copy; it is called under ``torch.no_grad`` only (the KL term's reference log-probs)."""

    def __init__(self, policy: torch.nn.Module) -> None:
        super().__init__()
        self._policy = [policy]  # a list: not registered as a child

    def forward(self, *args, **kwargs):
        policy = self._policy[0]
        with policy.disable_adapter():
            return policy(*args, **kwargs)


def is_lora(model: torch.nn.Module) -> bool:
    """A policy wrapped by :func:`wrap`."""
    return callable(getattr(model, "disable_adapter", None)) and hasattr(model, "peft_config")


def adapter_state(weights: Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The adapter's tensors of a LoRA policy's state (a state dict, or (name, tensor) pairs one at a time: a
    sharded policy gathered, iterated to the end), under PEFT's saved names; ValueError when there are none."""
    pairs = weights.items() if isinstance(weights, Mapping) else weights
    state = {saved_name(name): tensor for name, tensor in pairs if is_adapter_key(name)}
    if not state:
        raise ValueError("a LoRA job's policy has no adapter tensors (lora_A, lora_B) to publish")
    return state


def model_key(name: str, *, adapter: str = ADAPTER_NAME) -> str:
    """The key in a wrapped policy's state dict of the adapter tensor saved as ``name`` (the adapter's name put
    back: ``...q_proj.lora_A.weight`` -> ``...q_proj.lora_A.default.weight``)."""
    for part in (".lora_A.", ".lora_B."):
        if part in name:
            return name.replace(part, f"{part}{adapter}.", 1)
    raise ValueError(f"{name!r} is not a LoRA tensor")


@torch.no_grad()
def load_adapter(model: torch.nn.Module, saved: Mapping[str, torch.Tensor]) -> None:
    """Put a published adapter (PEFT's saved names) into the wrapped ``model``, the base untouched; an empty
    ``saved`` is the base itself (every ``lora_B`` zero: version 0). ValueError, and nothing loaded, when the
    tensors do not name exactly the model's adapter."""
    own = {name: tensor for name, tensor in model.state_dict().items() if is_adapter_key(name)}
    if not saved:
        saved = {saved_name(name): torch.zeros_like(t) if ".lora_B." in name else t for name, t in own.items()}
    state = {model_key(name): tensor for name, tensor in saved.items()}
    wrong = sorted(set(state) ^ set(own)) or [k for k, t in state.items() if t.shape != own[k].shape]
    if wrong:
        raise ValueError(f"the adapter does not fit the model: {wrong[:3]}")
    model.load_state_dict(state, strict=False)

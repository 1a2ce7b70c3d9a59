"""Generation engines: ``hf`` (transformers; CPU or GPU) and ``vllm`` (CUDA, ``pip install echo2[vllm]``).

Engines are imported on demand: importing this package loads neither torch nor vLLM.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .base import Completion, Engine, SamplingParams

ENGINES = ("hf", "vllm")

__all__ = ["ENGINES", "Completion", "Engine", "SamplingParams", "default_engine", "make_engine"]


def vllm_usable() -> bool:
    """vLLM is installed and a CUDA GPU is visible."""
    if importlib.util.find_spec("vllm") is None:
        return False
    import torch

    return torch.cuda.is_available()


def default_engine() -> str:
    return "vllm" if vllm_usable() else "hf"


def make_engine(name: str | None, model_dir: str, **kwargs: Any) -> Engine:
    """Load ``model_dir`` in the named engine (``None`` or ``"auto"``: vllm where usable, else hf).

    ``kwargs`` go to the engine's constructor (``seed`` for both; ``device`` for hf; vLLM engine
    arguments for vllm). Raises ValueError for an unknown name.
    """
    name = default_engine() if name in (None, "auto") else name
    if name == "hf":
        from .hf import HFEngine

        return HFEngine(model_dir, **kwargs)
    if name == "vllm":
        from .vllm import VLLMEngine

        return VLLMEngine(model_dir, **kwargs)
    raise ValueError(f"engine: unknown engine {name!r}; use one of {', '.join(ENGINES)} or 'auto'")

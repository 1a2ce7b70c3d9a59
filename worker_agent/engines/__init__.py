"""Generation engines: ``hf`` (transformers; CPU or GPU) and ``vllm`` (CUDA, ``pip install echo2[vllm]``).

Engines are imported on demand: importing this package loads neither torch nor vLLM.
"""

from __future__ import annotations

import importlib.util
from typing import Any

from .base import Completion, Engine, SamplingParams

ENGINES = ("hf", "vllm")

__all__ = ["ENGINES", "Completion", "Engine", "SamplingParams", "default_engine", "make_engine", "warm_imports"]


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


def warm_imports(name: str | None, model_dir: str | None = None) -> float:
    """Import what building the named engine will import (seconds spent), so that an agent that starts, or
    restarts after a crash, spends its first assignment loading weights rather than importing transformers or
    vLLM (seconds on a loaded CPU: 6 s of the 8 s a killed agent took to deliver again). ``model_dir``, a base
    model the agent used before, also brings in its architecture's modules. Never raises: a failure here is
    met again, and reported, when the engine is built."""
    import time

    started = time.monotonic()
    name = default_engine() if name in (None, "auto") else name
    try:
        if name == "hf":
            from .hf import warm_imports as warm_hf

            warm_hf(model_dir)
        elif name == "vllm":
            import vllm  # noqa: F401
    except Exception:  # noqa: BLE001 - the engine build reports the real error
        pass
    return time.monotonic() - started

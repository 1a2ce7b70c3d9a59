"""What a job needs of a worker (``JobSpec.requirements``), and the GPU memory a model needs when the owner gives none.

The site matches these against the hardware the agents reported (``dataplane/hardware.py``;
``marketplace/core/matching.py``): activation considers only the workers that meet them, and the plan preview says
how many do and why the others do not.

The memory estimate (:func:`estimate_memory`) is deliberately simple, and says what it assumed:

    weights  = parameters x bytes per weight (2 for the bf16 snapshots engines serve, 4 for fp32 ones)
    kv cache = 2 (K and V) x layers x kv_heads x head_dim x bytes x context x concurrent sequences
    total    = (weights + kv cache) x 1.2 + 0.5 GB  for hf (activations, allocator slack, CUDA context)
               (weights + kv cache) / 0.9 + 1.0 GB  for vllm (it keeps 10% free; CUDA graphs)

with ``parameters`` from the checkpoint's size on disk and its dtype (else from config.json's shape), ``context``
= the model's window, at most ``PROMPT_TOKENS`` + ``max_new_tokens``, and ``concurrent`` = one prompt group of
``n`` sequences times ``GROUPS_IN_FLIGHT`` (the agent's default lease). It is an estimate for matching, not a
promise: an owner who knows better gives ``min_gpu_memory_gb``.
"""

from __future__ import annotations

import json
import math
import os
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

GB = 1e9
PROMPT_TOKENS = 512  # prompts of the tasks we ship are far shorter; a long-prompt task should state its memory
GROUPS_IN_FLIGHT = 2  # the agent's default --groups
_DTYPE_BYTES = {"float32": 4, "float": 4, "float16": 2, "half": 2, "bfloat16": 2, "float64": 8, "int8": 1}


class Requirements(BaseModel):
    """What a worker must have for this job; a worker that fails any is never activated for it."""

    model_config = ConfigDict(extra="forbid")

    min_gpu_memory_gb: float | None = Field(
        default=None, gt=0, le=1e5, description="Memory the engine needs on one GPU (on a CPU-only worker: its RAM), "
        "GB; default: estimated from the model's size, the snapshot dtype, the engine and the context "
        "(dataplane/requirements.py).")
    engine: Literal["any", "hf", "vllm"] = Field(
        default="any", description="The generation engine a worker must have: any, hf, or vllm (a CUDA GPU with "
        "vLLM installed).")
    max_price_per_hour: float | None = Field(
        default=None, gt=0, le=1e6, description="The most a worker may cost, USD per hour; null: any price.")
    min_reliability: float = Field(
        default=0.0, ge=0.0, le=1.0, description="The least long-run reliability a worker must have, in [0, 1] "
        "(docs/scheduling.md \"Reliability\"); 0: any.")


@dataclass(frozen=True)
class MemoryEstimate:
    gb: float
    note: str  # how it was reached, one line


def estimate_memory(model_dir: str, *, engine: str, snapshot_dtype: str, max_new_tokens: int,
                    group_size: int) -> MemoryEstimate | None:
    """The GPU memory (GB) serving ``model_dir`` is estimated to need (module docstring); None when its config.json
    cannot be read (the site then matches on the other requirements alone)."""
    try:
        config = json.loads(_small_file(Path(model_dir) / "config.json"))
    except (OSError, ValueError):
        return None
    if not isinstance(config, dict):
        return None
    text = config.get("text_config") if isinstance(config.get("text_config"), dict) else config
    try:
        hidden = int(text["hidden_size"])
        layers = int(text["num_hidden_layers"])
        heads = int(text.get("num_attention_heads") or 1)
        kv_heads = int(text.get("num_key_value_heads") or heads)
        head_dim = int(text.get("head_dim") or hidden // max(heads, 1))
        window = int(text.get("max_position_embeddings") or PROMPT_TOKENS + max_new_tokens)
    except (KeyError, TypeError, ValueError):
        return None
    params, counted = _parameters(Path(model_dir), config, hidden=hidden, layers=layers, vocab=text.get("vocab_size"))
    width = 4 if snapshot_dtype == "fp32" else 2
    weights = params * width
    context = min(window, PROMPT_TOKENS + max_new_tokens)
    sequences = group_size * GROUPS_IN_FLIGHT
    kv = 2 * layers * kv_heads * head_dim * width * context * sequences
    if engine == "vllm":
        total, how = (weights + kv) / 0.9 + 1.0 * GB, "/0.9 + 1 GB (vllm)"
    else:
        total, how = (weights + kv) * 1.2 + 0.5 * GB, "x1.2 + 0.5 GB (hf)"
    note = (f"{params / 1e9:.3g}B parameters ({counted}) x {width} B = {weights / GB:.3g} GB, KV cache "
            f"{kv / GB:.3g} GB ({context} tokens x {sequences} sequences), {how}")
    return MemoryEstimate(gb=round(total / GB, 3), note=note)


MAX_CONFIG_BYTES = 1 << 20  # a model's config.json is a few KB


def _small_file(path: Path) -> bytes:
    """The bytes of ``path`` if it is a regular file of at most ``MAX_CONFIG_BYTES``, opened without blocking (the
    site reads the path a job names: a FIFO or a device must not hang or fill it; a symlink is followed, as the
    Hugging Face cache's snapshot folders are made of them); OSError otherwise."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_CONFIG_BYTES:
            raise OSError(f"{path}: not a regular file of at most {MAX_CONFIG_BYTES} bytes")
        data = f.read(MAX_CONFIG_BYTES + 1)
    if len(data) > MAX_CONFIG_BYTES:
        raise OSError(f"{path}: grew past {MAX_CONFIG_BYTES} bytes")
    return data


def _parameters(model_dir: Path, config: dict, *, hidden: int, layers: int, vocab) -> tuple[float, str]:
    """The parameter count: the weights' bytes on disk over their dtype's width, else the usual shape estimate
    (12 h^2 per layer plus the embeddings)."""
    files = list(model_dir.glob("*.safetensors")) or list(model_dir.glob("*.bin"))
    sizes = [f.stat() for f in files]
    on_disk = sum(s.st_size for s in sizes if stat.S_ISREG(s.st_mode))
    dtype = str(config.get("torch_dtype") or config.get("dtype") or "bfloat16").removeprefix("torch.")
    if on_disk:
        return on_disk / _DTYPE_BYTES.get(dtype, 2), f"from {on_disk / GB:.3g} GB of {dtype} weights on disk"
    embeddings = (int(vocab) if isinstance(vocab, int) else 32_000) * hidden
    return float(12 * layers * hidden * hidden + embeddings), "from config.json's shape"


def memory_needed(requirements: Requirements, estimate: MemoryEstimate | None) -> tuple[float | None, str]:
    """The memory to match on and why: the owner's figure, else the estimate, else none."""
    if requirements.min_gpu_memory_gb is not None:
        return requirements.min_gpu_memory_gb, "given"
    if estimate is not None and math.isfinite(estimate.gb):
        return estimate.gb, f"estimated: {estimate.note}"
    return None, "unknown (the model's config.json could not be read): not matched on"

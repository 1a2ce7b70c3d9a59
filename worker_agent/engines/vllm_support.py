"""The vLLM engine's decisions, as plain functions that import neither vLLM nor torch (tested on any machine).

- :func:`sampling_kwargs`: our :class:`~worker_agent.engines.base.SamplingParams` as the keyword arguments of one
  ``vllm.SamplingParams`` per prompt (greedy asks for one sample, the engine replicates it; see ``base``).
- :func:`checkpoint_keys` and :func:`check_snapshot_keys`: an install names exactly the base checkpoint's weights, or
  nothing is installed (vLLM's reload only logs the weights it did not load).
- :func:`reset_prefix_cache`: KV blocks cached under the old weights are dropped, or the install fails (vLLM's
  ``reset_prefix_cache`` returns False, and resets nothing, while requests hold blocks).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from .base import SamplingParams

TIED_HEAD = "lm_head.weight"  # absent from checkpoints (and snapshots) of models that tie it to the embeddings
# The releases the engine accepts without a warning, [0.33, 0.35): written against 0.34.0's source; echo2[vllm] installs
# 0.33 (0.34.0 pins a flashinfer-python the registry lacks), whose wheel has every API the engine calls with the same
# signature (LLM.collective_rpc, LLM.reset_prefix_cache, the worker's reload_weights(weights_iterator=),
# worker_extension_cls, logprobs_mode="raw_logprobs", LoRARequest, SamplingParams). Neither has run on a GPU here.
TESTED_VERSIONS = ("0.33.0", "0.35.0")


def sampling_kwargs(params: SamplingParams, *, n: int, stop: Iterable[str], seed: int | None) -> dict[str, Any]:
    """Keyword arguments of ``vllm.SamplingParams`` for one prompt's ``n`` samples.

    Greedy (``params.greedy``) asks for a single sample at temperature 0 and no seed: vLLM refuses greedy with
    ``n > 1``, and the caller returns that sample ``n`` times. Otherwise sample ``i`` is seeded ``seed + i`` by
    vLLM, so ``seed`` must start a block of ``n`` seeds of its own (:class:`~worker_agent.engines.seeds.SeedStream`).
    Log-probs: one per sampled token (``logprobs=0``), raw when the engine is built with ``logprobs_mode``.
    """
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    greedy = params.greedy
    return {
        "n": 1 if greedy else n,
        "temperature": 0.0 if greedy else params.temperature,
        "top_p": 1.0 if greedy else params.top_p,
        "seed": None if greedy else seed,
        "max_tokens": params.max_new_tokens,
        "logprobs": 0,
        "stop": list(stop),
        "include_stop_str_in_output": True,  # as the HF engine: the stop string stays in the completion
    }


def checkpoint_keys(model_dir: str | Path) -> tuple[frozenset[str], bool]:
    """The tensor names of the safetensors checkpoint in ``model_dir`` (one file or sharded with an index), and
    whether its config ties the output head to the embeddings. Reads headers only, never the weights."""
    from safetensors import safe_open

    model_dir = Path(model_dir)
    config = json.loads((model_dir / "config.json").read_text()) if (model_dir / "config.json").exists() else {}
    tied = bool(config.get("tie_word_embeddings", False))
    index = model_dir / "model.safetensors.index.json"
    if index.exists():
        return frozenset(json.loads(index.read_text())["weight_map"]), tied
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} has no safetensors checkpoint; the vllm engine installs snapshots against one")
    keys: set[str] = set()
    for file in files:
        with safe_open(str(file), framework="numpy") as handle:
            keys.update(handle.keys())
    return frozenset(keys), tied


def check_snapshot_keys(names: Iterable[str], *, expected: frozenset[str], tied_head: bool) -> None:
    """Raise ValueError unless ``names`` are exactly the ``expected`` checkpoint names; a tied head may be there or
    not (vLLM skips it and re-ties it to the embeddings)."""
    names = set(names)
    optional = {TIED_HEAD} if tied_head else set()
    missing = sorted(expected - optional - names)
    unexpected = sorted(names - expected - optional)
    if missing or unexpected:
        raise ValueError(f"snapshot does not fit the model: missing={missing[:3]} unexpected={unexpected[:3]}"
                         + (f" ({len(missing)} missing, {len(unexpected)} unexpected)"
                            if len(missing) > 3 or len(unexpected) > 3 else ""))


def reset_prefix_cache(reset: Callable[..., bool], *, attempts: int = 5, wait_s: float = 0.05,
                       sleep: Callable[[float], None] = time.sleep) -> int:
    """Call ``reset`` (``LLM.reset_prefix_cache``) until it returns True: ``attempts`` times, waiting ``wait_s``
    doubled each time for running requests to finish, then once with ``reset_running_requests=True`` (vLLM preempts
    them; they recompute under the new weights). Returns the number of calls; raises RuntimeError when none worked,
    because generating from KV blocks computed by the old weights would mislabel the records' version."""
    for attempt in range(attempts):
        if reset():
            return attempt + 1
        sleep(wait_s * 2**attempt)
    if reset(reset_running_requests=True):
        return attempts + 1
    raise RuntimeError(f"vLLM did not reset its prefix cache after {attempts + 1} tries; the engine must not "
                       "generate until a snapshot is installed again")


def version_status(version: str) -> str:
    """Where ``version`` stands against :data:`TESTED_VERSIONS`: "tested", "older", "newer" or "unknown"."""
    try:
        from packaging.version import InvalidVersion, Version
    except ImportError:
        return "unknown"
    try:
        low, high = (Version(v) for v in TESTED_VERSIONS)
        found = Version(version)
    except InvalidVersion:
        return "unknown"
    return "older" if found < low else "newer" if found >= high else "tested"

"""Fully sharded data parallelism (FSDP2) for models that do not fit one device, and its checkpoints.

``--parallel fsdp`` shards every parameter, gradient and optimizer state across the ranks
(``torch.distributed.fsdp.fully_shard``: one group per transformer block, then the root), so a rank holds
``1/world`` of the 16 bytes per parameter that fp32 weights, gradients and AdamW's two moments take. The
sharded parameters stay fp32: they are the master weights the optimizer updates. With ``bf16`` each block
is all-gathered in bf16 for the forward and backward (``MixedPrecisionPolicy(param_dtype=bf16)``) and the
gradients are reduce-scattered in fp32.

Checkpoints of a sharded model are ``torch.distributed.checkpoint`` (DCP) directories: every rank writes
its own shards, keyed by parameter name, so any world size, sharded or not, loads them again
(:func:`load_sharded`). :func:`full_tensors` gathers the whole model one tensor at a time for a snapshot.
"""

from __future__ import annotations

import contextlib
import itertools
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

PARALLEL = ("ddp", "fsdp")


def shard(model: torch.nn.Module, *, device: str, world: int, bf16: bool = False) -> torch.nn.Module:
    """``fully_shard`` each of ``model``'s transformer blocks (Hugging Face's ``_no_split_modules``), then the
    root; returns ``model``, now an ``FSDPModule`` whose parameters are ``DTensor`` shards on ``device``.
    A model whose blocks are unknown is sharded as one group (correct; more memory at the forward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    mesh = init_device_mesh(torch.device(device).type, (world,))
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if bf16 else None, reduce_dtype=torch.float32)
    blocks = set(getattr(model, "_no_split_modules", None) or ())
    for module in model.modules():
        if module is not model and type(module).__name__ in blocks:
            fully_shard(module, mesh=mesh, mp_policy=policy)
    fully_shard(model, mesh=mesh, mp_policy=policy)
    return model


def is_sharded(model: torch.nn.Module) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def no_sync(model: torch.nn.Module) -> Iterator[None]:
    """Accumulate gradients unreduced through this block (micro-batches but the last; DDP's ``no_sync``)."""
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def checkpoint_activations(model: torch.nn.Module) -> None:
    """Recompute each block's activations in the backward instead of keeping them (Hugging Face models)."""
    enable = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(enable) or not getattr(model, "supports_gradient_checkpointing", False):
        raise ValueError(f"{type(model).__name__} does not support activation checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})


def as_float(value: torch.Tensor) -> float:
    """A scalar that may be a ``DTensor`` (a gradient norm over sharded gradients) as a Python float."""
    from torch.distributed.tensor import DTensor

    return float(value.full_tensor() if isinstance(value, DTensor) else value)


def full_tensors(model: torch.nn.Module, *, keep: bool = True) -> Iterator[tuple[str, torch.Tensor]]:
    """``model``'s state dict, unsharded, one tensor at a time on the CPU: (name, tensor) in state-dict order.

    A sharded parameter is all-gathered when its turn comes (a collective: every rank must run this to the
    end, in step; ranks other than the publisher pass ``keep=False`` and get nothing). So the whole model is
    never gathered at once: the caller holds what it keeps. A tied parameter (the output layer sharing the
    input embedding) is given once, under its first name, as the snapshot format wants.
    """
    from torch.distributed.tensor import DTensor

    aliases = _aliases(model)
    for name, tensor in model.state_dict().items():
        if name in aliases:
            continue
        full = tensor.full_tensor() if isinstance(tensor, DTensor) else tensor
        if keep:
            yield name, full.detach().to("cpu")
        del full


def _aliases(model: torch.nn.Module) -> set[str]:
    """Names of parameters and buffers that are the same object as an earlier name (tied weights)."""
    first: dict[int, str] = {}
    aliases = set()
    named = itertools.chain(model.named_parameters(remove_duplicate=False), model.named_buffers(remove_duplicate=False))
    for name, tensor in named:
        if id(tensor) in first:
            aliases.add(name)
        else:
            first[id(tensor)] = name
    return aliases


def save_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Write model and optimizer into the DCP directory ``path`` (every rank its own shards; a collective)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict

    model_state, optimizer_state = get_state_dict(model, optimizer)
    with _quiet_alone():
        dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path), no_dist=_alone())


def load_sharded(model: torch.nn.Module, optimizer: torch.optim.Optimizer, path: Path) -> None:
    """Load the DCP directory ``path`` into ``model`` and ``optimizer``, sharded or not, at any world size
    (every rank of this run; in one process without a process group, everything)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    if not (Path(path) / ".metadata").is_file():
        raise FileNotFoundError(f"{path}: not a sharded checkpoint (no .metadata); was the directory shared by "
                                "every rank when it was written?")
    model_state, optimizer_state = get_state_dict(model, optimizer)  # what to fill, laid out as this run shards
    with _quiet_alone():
        dcp.load({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=str(path), no_dist=_alone())
    set_state_dict(model, optimizer, model_state_dict=model_state, optim_state_dict=optimizer_state)


def whole_model(path: Path) -> dict[str, torch.Tensor]:
    """The model's tensors of the DCP directory ``path``, whole, in this process (an export; no model needed).
    A tied output layer is there under both its names, as the model's state dict has it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    metadata = FileSystemReader(str(path)).read_metadata()
    state = {key: torch.empty(meta.size, dtype=meta.properties.dtype)
             for key, meta in metadata.state_dict_metadata.items()
             if key.startswith("model.") and isinstance(meta, TensorStorageMetadata)}
    with _quiet_alone():
        dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return {key.removeprefix("model."): tensor for key, tensor in state.items()}


def _alone() -> bool:
    """No process group: DCP reads and writes everything in this process."""
    return not (dist.is_available() and dist.is_initialized())


@contextlib.contextmanager
def _quiet_alone() -> Iterator[None]:
    """DCP warns that it runs in one process even when told to (``no_dist``); one process is what we meant."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def load_full(model: torch.nn.Module, optimizer: torch.optim.Optimizer, model_state: dict | None,
              optimizer_state: dict | None) -> None:
    """Load a whole (single-process) checkpoint into a sharded model: rank 0 passes the states as
    ``torch.optim``'s ``state_dict`` wrote them, the other ranks None; each rank keeps its shards."""
    from torch.distributed.checkpoint.state_dict import (
        StateDictOptions,
        set_model_state_dict,
        set_optimizer_state_dict,
    )

    options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True)
    main = dist.get_rank() == 0
    set_model_state_dict(model, dict(model_state) if main and model_state else {}, options=options)
    by_name = _optimizer_by_name(optimizer_state, model) if main and optimizer_state else {}
    set_optimizer_state_dict(model, optimizer, by_name, options=options)


def _optimizer_by_name(state: dict[str, Any], model: torch.nn.Module) -> dict[str, Any]:
    """``torch.optim``'s state dict keys parameters by their index in what it was given, the parameters that train
    (a LoRA policy's adapter alone: learner/lora.py); the sharded loaders key them by name. Both count a tied
    parameter once, in the same order."""
    names = [name for name, p in model.named_parameters() if p.requires_grad]
    if len(names) != sum(len(g["params"]) for g in state["param_groups"]):
        raise ValueError(f"the checkpoint's optimizer has {sum(len(g['params']) for g in state['param_groups'])} "
                         f"parameters, the model {len(names)}")
    return {"state": {names[i]: value for i, value in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]}

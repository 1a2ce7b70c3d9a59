"""What this machine has (``dataplane.hardware.Hardware``), measured where it runs: sent at registration and in
every hello. Cheap and best effort: a probe that cannot read a figure reports it empty, never fails the agent."""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
from pathlib import Path

from dataplane.hardware import Gpu, Hardware

GB = 1e9


def probe(cache_dir: Path | None = None) -> Hardware:
    """This machine's GPUs (torch.cuda, when torch and a GPU are there), driver, engines, CPUs, RAM and the free
    disk under ``cache_dir`` (default: the base-model cache's)."""
    from .cache import default_cache_dir

    gpus, cuda = _gpus()
    engines = [name for name, module in (("hf", "transformers"), ("vllm", "vllm"))
               if _importable(module) and (name == "hf" or gpus)]
    return Hardware(gpus=gpus, cuda=cuda, driver=_driver() if gpus else "", engines=engines,
                    cpu_count=os.cpu_count() or 1, ram_gb=round(_ram_bytes() / GB, 2),
                    disk_free_gb=round(_free_bytes(cache_dir or default_cache_dir()) / GB, 2))


def _importable(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def _gpus() -> tuple[list[Gpu], str]:
    try:
        import torch

        if not torch.cuda.is_available():
            return [], ""
        out = []
        for index in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(index)
            out.append(Gpu(name=props.name[:100], memory_gb=round(props.total_memory / GB, 2),
                           capability=f"{props.major}.{props.minor}"))
        return out, (torch.version.cuda or "")[:16]
    except Exception:  # a broken driver or torch build: report no GPU rather than fail the agent
        return [], ""


def _driver() -> str:
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return ""
    lines = done.stdout.strip().splitlines()
    return lines[0].strip()[:32] if lines else ""


def _ram_bytes() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return 0.0


def _free_bytes(path: Path) -> float:
    """Free bytes on the disk holding ``path`` (its nearest existing parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            try:
                return float(shutil.disk_usage(candidate).free)
            except OSError:
                return 0.0
    return 0.0

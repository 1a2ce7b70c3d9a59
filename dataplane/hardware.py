"""What a worker's machine has, as its agent measured it (``worker_agent/hardware.py probe``).

The agent sends it at registration and in every hello; the site stores it on the worker (``Worker.hardware``)
and matches jobs' requirements against it (``dataplane/requirements.py``, ``marketplace/core/matching.py``).
It is a claim, bounded and checked here and used only for matching: a machine that claims more memory than it
has fails its jobs, and the site's own measurements (silence, throughput, audits) catch it (docs/trust.md,
"What the scheduler believes").
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import ConfigDict, Field

from .strict import StrictModel

Engine = Literal["hf", "vllm"]
MAX_GPUS = 64
MAX_MEMORY_GB = 1e5  # per GPU, or the machine's RAM: far beyond any one machine
MAX_DISK_GB = 1e7


class _Facts(StrictModel):
    model_config = ConfigDict(frozen=True)  # and strict.StrictModel's: no unknown key, NaN, infinity or NUL


class Gpu(_Facts):
    name: str = Field(max_length=100, description="The device's name, e.g. 'NVIDIA H100 80GB HBM3'.")
    memory_gb: float = Field(ge=0, le=MAX_MEMORY_GB, description="Total device memory, GB (1e9 bytes).")
    capability: str = Field(default="", max_length=8, pattern=r"^(\d{1,2}\.\d{1,2})?$",
                            description="CUDA compute capability, e.g. '9.0'.")


class Hardware(_Facts):
    """One machine's facts. Memory and disk in GB (1e9 bytes)."""

    gpus: list[Gpu] = Field(default_factory=list, max_length=MAX_GPUS, description="Its GPUs; none on a CPU box.")
    cuda: str = Field(default="", max_length=16, description="CUDA version torch was built with, if any.")
    driver: str = Field(default="", max_length=32, description="NVIDIA driver version, if any.")
    engines: list[Engine] = Field(default_factory=list, max_length=2, description="Generation engines that import "
                                  "here (vllm only where there is a GPU).")
    cpu_count: int = Field(default=1, ge=1, le=100_000)
    ram_gb: float = Field(default=0.0, ge=0, le=MAX_MEMORY_GB)
    disk_free_gb: float = Field(default=0.0, ge=0, le=MAX_DISK_GB, description="Free disk where base models are "
                                "cached.")

    @property
    def gpu_count(self) -> int:
        return len(self.gpus)

    @property
    def gpu_memory_gb(self) -> float:
        """Memory of its largest GPU (an engine runs on one), 0 without one."""
        return max((gpu.memory_gb for gpu in self.gpus), default=0.0)

    @property
    def model_memory_gb(self) -> float:
        """The memory a model can be served from: the largest GPU's, or the RAM on a CPU-only machine (hf)."""
        return self.gpu_memory_gb if self.gpus else self.ram_gb

    def summary(self) -> str:
        """One line for pages and logs: ``2 x NVIDIA A100 (80 GB, sm 8.0), 32 CPUs, 256 GB RAM, hf+vllm``."""
        if self.gpus:
            first = self.gpus[0]
            sm = f", sm {first.capability}" if first.capability else ""
            devices = f"{self.gpu_count} x {first.name} ({first.memory_gb:.0f} GB{sm})"
        else:
            devices = "no GPU"
        engines = "+".join(self.engines) or "no engine"
        return f"{devices}, {self.cpu_count} CPUs, {self.ram_gb:.0f} GB RAM, {self.disk_free_gb:.0f} GB free, {engines}"


def parse_hardware(raw: Any) -> Hardware:
    """``raw`` (JSON) as :class:`Hardware`; a ``ValueError`` naming the first bad field otherwise."""
    from pydantic import ValidationError

    try:
        return Hardware.model_validate(raw)
    except ValidationError as err:
        first = err.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "hardware"
        raise ValueError(f"hardware.{where}: {first['msg']}") from None

"""The weights an agent holds for its job, and how a published version becomes tensors (docs/broadcast.md "Formats").

A full snapshot is read as it comes. A delta (:mod:`dataplane.delta`) is applied to the full payload of the version
it names, which the agent keeps from its last install (:class:`HeldWeights`: the chunks of a safetensors payload,
as many bytes as the model in the snapshot dtype, half of fp32 in bf16); the result must hash to the learner's
digest of that version's full payload, so the engine gets the learner's weights bit for bit. An agent that does not
hold the base (it joined late, or missed or failed that version) fetches the full payload instead
(``{url}full/``, :mod:`worker_agent.installs`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from dataplane.delta import apply_delta
from dataplane.lora import ADAPTER_FORMAT, LoraSpec, spec_from_metadata
from dataplane.snapshot import Manifest, SnapshotError
from dataplane.tensorfile import ChunkedPayload, layout, metadata

TORCH_DTYPES = {"BOOL": torch.bool, "U8": torch.uint8, "I8": torch.int8, "I16": torch.int16, "F16": torch.float16,
                "BF16": torch.bfloat16, "I32": torch.int32, "F32": torch.float32, "I64": torch.int64,
                "F64": torch.float64}


@dataclass(frozen=True)
class HeldWeights:
    """The full payload of the version installed in the engine: what the next delta applies to."""

    manifest: Manifest
    chunks: list[bytes]

    @property
    def version(self) -> int:
        return self.manifest.version

    def adapter(self) -> LoraSpec | None:
        """The adapter's settings when the payload is a LoRA adapter (dataplane/lora.py), else None (the weights)."""
        if self.manifest.format != ADAPTER_FORMAT:
            return None
        try:
            return spec_from_metadata(metadata(ChunkedPayload(self.chunks, self.manifest.chunk_bytes)))
        except ValueError as err:  # pydantic's errors included
            raise SnapshotError(f"version {self.version}: {err}") from None

    def tensors(self) -> dict[str, torch.Tensor]:
        """The payload's tensors, each copied out of the chunks (the chunks are never joined)."""
        payload = ChunkedPayload(self.chunks, self.manifest.chunk_bytes)
        out = {}
        for info in layout(payload):
            if info.dtype not in TORCH_DTYPES:
                raise SnapshotError(f"tensor {info.name}: dtype {info.dtype} is not one torch reads")
            raw = bytearray(payload.read(info.begin, info.nbytes))
            tensor = torch.frombuffer(raw, dtype=TORCH_DTYPES[info.dtype]) if raw else torch.empty(
                0, dtype=TORCH_DTYPES[info.dtype])
            out[info.name] = tensor.reshape(info.shape)
        return out


def rebuild(manifest: Manifest, chunks: list[bytes], held: HeldWeights | None) -> HeldWeights:
    """The full payload of ``manifest``'s version from its verified ``chunks``: as is for a full snapshot; for a
    delta, applied to ``held``, which must be the delta's base (:class:`SnapshotError` otherwise)."""
    if manifest.kind == "full":
        return HeldWeights(manifest, chunks)
    if held is None:
        raise SnapshotError(f"version {manifest.version} is a delta against version {manifest.base_version}, and "
                            "this agent holds no weights to apply it to")
    return HeldWeights(manifest.full, apply_delta(manifest, chunks, held.manifest, held.chunks))

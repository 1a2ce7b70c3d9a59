"""A snapshot's safetensors payload as the ``model.safetensors`` of an exported model, streamed.

A snapshot (any version after 0) is one safetensors file: an 8-byte little-endian header length, a JSON
header naming each tensor's dtype, shape and byte range in the data section, then the data. An export writes
it with the header Hugging Face's ``save_pretrained`` writes (``__metadata__`` ``{"format": "pt"}``, padded to
8 bytes) and, as asked, either the data unchanged (``as-trained``) or every floating tensor cast to bfloat16
(``bf16``): half the bytes, what vLLM serves by default. Nothing is held whole: the header is read first, the
output size is known before a byte is written (an archive's member header needs it), and the data is read
and written tensor by tensor (a cast rounds to nearest even, as torch does, with numpy).
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

DTYPES = ("as-trained", "bf16")
"""What an export may write: the tensors as the learner trained them, or floating ones cast to bfloat16."""
MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit
_PIECE = 4 << 20
_BYTES = {"F64": 8, "F32": 4, "F16": 2, "BF16": 2, "I64": 8, "I32": 4, "I16": 2, "I8": 1, "U8": 1, "BOOL": 1,
          "U16": 2, "U32": 4, "U64": 8, "F8_E4M3": 1, "F8_E5M2": 1}
_CAST_TO_BF16 = {"F64", "F32", "F16"}
TORCH_NAMES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16"}
"""safetensors' floating dtypes by the name ``config.json`` gives them (``"dtype": "bfloat16"``)."""


class WeightsError(ValueError):
    """A payload that is not a safetensors file this module can write out; ``str(err)`` says what is wrong."""


@dataclass(frozen=True)
class Tensor:
    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int  # byte range in the source's data section
    end: int

    @property
    def count(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class WeightsPlan:
    """How one safetensors payload is written out: the new header, the tensors in data order, the cast."""

    header: bytes  # length prefix and JSON, padded
    tensors: tuple[Tensor, ...]
    data_start: int  # where the source's data section begins
    cast: bool  # floating tensors to bf16
    size: int  # bytes written in all
    dtype: str  # the floating dtype most of the written bytes have, as config.json names it ("float32")

    def pieces(self, source: BinaryIO) -> Iterator[bytes]:
        """The written file, in pieces, read from ``source`` (the payload: seekable, read from the start)."""
        yield self.header
        source.seek(self.data_start)
        if not self.cast:  # the data section unchanged
            left = self.tensors[-1].end if self.tensors else 0
            while left > 0:
                piece = source.read(min(_PIECE, left))
                if not piece:
                    raise WeightsError("safetensors payload ends before its data does")
                left -= len(piece)
                yield piece
            return
        for tensor in self.tensors:
            source.seek(self.data_start + tensor.begin)
            raw = _read_exactly(source, tensor.end - tensor.begin)
            yield _to_bf16(raw, tensor.dtype) if tensor.dtype in _CAST_TO_BF16 else raw


def plan(source: BinaryIO, *, dtype: str = "as-trained") -> WeightsPlan:
    """Read the header of the safetensors payload ``source`` and plan writing it as ``dtype`` (:data:`DTYPES`)."""
    if dtype not in DTYPES:
        raise WeightsError(f"dtype must be one of {', '.join(DTYPES)}, not {dtype!r}")
    source.seek(0)
    (length,) = struct.unpack("<Q", _read_exactly(source, 8))
    if not 2 <= length <= MAX_HEADER_BYTES:
        raise WeightsError(f"safetensors header of {length} bytes")
    try:
        header = json.loads(_read_exactly(source, length))
    except ValueError as err:
        raise WeightsError(f"safetensors header is not JSON: {err}") from None
    if not isinstance(header, dict):
        raise WeightsError("safetensors header is not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    tensors = sorted((_tensor(name, info) for name, info in header.items()), key=lambda t: t.begin)
    for before, tensor in zip([None, *tensors], tensors, strict=False):
        if tensor.begin != (before.end if before else 0):
            raise WeightsError(f"tensor {tensor.name!r}: the data section has a gap or an overlap before it")
    cast = dtype == "bf16"
    out_header: dict = {"__metadata__": {**{str(k): str(v) for k, v in metadata.items()}, "format": "pt"}}
    offset, floating = 0, {}
    for tensor in tensors:
        out_dtype = "BF16" if cast and tensor.dtype in _CAST_TO_BF16 else tensor.dtype
        size = tensor.count * _BYTES[out_dtype]
        out_header[tensor.name] = {"dtype": out_dtype, "shape": list(tensor.shape),
                                   "data_offsets": [offset, offset + size]}
        if out_dtype in TORCH_NAMES:
            floating[out_dtype] = floating.get(out_dtype, 0) + size
        offset += size
    text = json.dumps(out_header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)  # as safetensors pads: the data section starts 8-byte aligned
    head = struct.pack("<Q", len(text)) + text
    main = max(floating, key=floating.__getitem__) if floating else "F32"
    return WeightsPlan(head, tuple(tensors), 8 + length, cast, len(head) + offset, TORCH_NAMES[main])


def _tensor(name: str, info: object) -> Tensor:
    if not isinstance(info, dict):
        raise WeightsError(f"tensor {name!r}: not described by an object")
    dtype, shape, offsets = info.get("dtype"), info.get("shape"), info.get("data_offsets")
    if dtype not in _BYTES:
        raise WeightsError(f"tensor {name!r}: unknown dtype {dtype!r}")
    if (not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape)
            or not isinstance(offsets, list) or len(offsets) != 2 or not all(isinstance(o, int) for o in offsets)):
        raise WeightsError(f"tensor {name!r}: bad shape or data_offsets")
    tensor = Tensor(name, dtype, tuple(shape), offsets[0], offsets[1])
    if tensor.end - tensor.begin != tensor.count * _BYTES[dtype] or tensor.begin < 0:
        raise WeightsError(f"tensor {name!r}: data_offsets do not fit its shape and dtype")
    return tensor


def _read_exactly(source: BinaryIO, n: int) -> bytes:
    data = source.read(n)
    if len(data) != n:
        raise WeightsError(f"safetensors payload ends early (wanted {n} bytes, got {len(data)})")
    return data


def _to_bf16(raw: bytes, dtype: str) -> bytes:
    """Little-endian floats of ``dtype`` as bfloat16, rounded to nearest even as torch's ``.to(torch.bfloat16)``
    rounds (through float32, as torch takes a double; any NaN becomes 0x7FC0), with numpy: this plane and the
    site import no torch."""
    import numpy as np

    values = np.frombuffer(raw, dtype={"F64": "<f8", "F32": "<f4", "F16": "<f2"}[dtype]).astype("<f4")
    bits = values.view("<u4")
    with np.errstate(over="ignore"):  # only NaN bit patterns can wrap; they are replaced below
        rounded = ((bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16).astype("<u2")
    return np.where(np.isnan(values), np.uint16(0x7FC0), rounded).astype("<u2").tobytes()

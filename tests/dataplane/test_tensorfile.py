"""The safetensors layout written a tensor at a time (dataplane/tensorfile.py): what safetensors itself reads, and
read back from chunks without joining them; a header that is not one is refused with the reason."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import load, save

from dataplane.snapshot import SnapshotError, split
from dataplane.tensorfile import ChunkedPayload, TensorInfo, header, layout

TENSORS = {"embed.weight": torch.randn(7, 5).to(torch.bfloat16), "norm.weight": torch.ones(5),
           "position_ids": torch.arange(3), "scale": torch.tensor(2.0), "empty": torch.zeros(0, 4)}
NAMES = {torch.bfloat16: "BF16", torch.float32: "F32", torch.int64: "I64"}


def written() -> bytes:
    infos = [TensorInfo(name, NAMES[t.dtype], tuple(t.shape)) for name, t in TENSORS.items()]
    return header(infos) + b"".join(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()
                                    for t in TENSORS.values())


def test_safetensors_reads_what_we_write():
    payload = written()
    loaded = load(payload)
    assert set(loaded) == set(TENSORS)
    for name, tensor in TENSORS.items():
        assert loaded[name].dtype == tensor.dtype and torch.equal(loaded[name], tensor), name
    (length,) = struct.unpack("<Q", payload[:8])
    assert (8 + length) % 8 == 0  # the data starts aligned


@pytest.mark.parametrize("chunk_bytes", [7, 64, 10_000])
def test_the_layout_and_every_tensors_bytes_read_back_from_chunks(chunk_bytes):
    payload = written()
    chunked = ChunkedPayload(split(payload, chunk_bytes), chunk_bytes)
    infos = layout(chunked)
    assert [i.name for i in infos] == list(TENSORS)
    for info in infos:
        raw = bytes(chunked.read(info.begin, info.nbytes))
        assert raw == payload[info.begin:info.begin + info.nbytes]
    assert layout(ChunkedPayload(split(save(TENSORS), chunk_bytes), chunk_bytes))  # safetensors' own files too
    with pytest.raises(SnapshotError, match="outside a payload"):
        chunked.read(len(payload) - 2, 3)


def test_a_header_that_is_not_one_is_refused():
    payload = written()
    (length,) = struct.unpack("<Q", payload[:8])
    entries = json.loads(payload[8:8 + length])

    def with_entries(changed: dict) -> ChunkedPayload:
        text = json.dumps(changed).encode()
        text += b" " * (-(8 + len(text)) % 8)
        data = struct.pack("<Q", len(text)) + text + payload[8 + length:]
        return ChunkedPayload([data], len(data))

    cases = {
        "payload has an 8-byte header length": ChunkedPayload([b"abc"], 3),
        "safetensors header of": ChunkedPayload([struct.pack("<Q", 10**9) + b"{}"], 10),
        "not a safetensors header": with_entries({"x": {"dtype": "F32"}}),
        "tensor norm.weight: dtype F32 at byte": with_entries(entries | {"norm.weight": entries["norm.weight"] | {
            "data_offsets": [0, 20]}}),
        "tensor scale: dtype Q4 at byte": with_entries(entries | {"scale": entries["scale"] | {"dtype": "Q4"}}),
        "the tensors end at byte": with_entries({k: v for k, v in entries.items() if k != "empty" and k != "scale"}),
    }
    for reason, bad in cases.items():
        with pytest.raises(SnapshotError, match=reason):
            layout(bad)

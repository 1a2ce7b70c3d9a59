"""The learner's published versions: the policy streamed a tensor at a time into chunks, in the dtype engines serve,
and a lossless delta against the previous version (docs/broadcast.md "Formats").

:meth:`SnapshotStore.write` casts each tensor to the job's ``snapshot_dtype`` (bf16 by default) as it goes and
writes it into chunks on disk (:class:`~dataplane.snapshot.ChunkCutter`): the only whole-model copy is the
model itself. A sharded policy's tensors come gathered one at a time (``PolicyTrainer.full_state``): the
header needs every shape first, so they are cast and spilled to a file as they come and chunked after it.

When the previous version's full payload is on disk and has the same layout, each new chunk is also XORed with
the previous version's chunk and compressed (:mod:`dataplane.delta`); the version is then published as that delta
(what the relays forward), with its full payload kept beside it (``v<n>/full/``): the learner's cache of fulls,
from which a worker that joins or falls behind (it lacks the delta's base) fetches the newest version whole over
HTTP before it follows the deltas (docs/broadcast.md "Deltas on the wire, fulls from the cache"). After the first
version nothing goes on the wire full unless the job asks for it (``full_every`` K >= 1: every K-th version, the
old schedule), the delta does not pay (larger than ``MAX_DELTA_FRACTION`` of the full payload: fp32 weights at a
large learning rate), or ``MAX_UNANNOUNCED`` versions already wait for the site (it is down): a full one then
replaces them in the learner's outbox, so neither the queue nor the disk it pins grows without bound.

A LoRA job's store (``adapter``) publishes every version after the base as the adapter alone (format
``lora-safetensors``, its settings in the payload's metadata: dataplane/lora.py), by the same rules: a delta against
the previous adapter only where it pays.
"""

from __future__ import annotations

import logging
import shutil
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

import torch

from dataplane import basemodel
from dataplane.broadcast.store import (
    CHUNKS,
    chunk_files,
    full_payload,
    iter_chunks,
    list_versions,
    prune_versions,
    read_manifest,
    staging,
    version_dir,
    write_manifest,
    write_version,
)
from dataplane.delta import ENCODING, DeltaEncoder
from dataplane.lora import ADAPTER_FORMAT, LoraSpec, adapter_metadata
from dataplane.snapshot import DEFAULT_CHUNK_BYTES, FULL, ChunkCutter, Manifest, build_manifest
from dataplane.tensorfile import ChunkedPayload, TensorInfo, header, layout

from .lora import adapter_state

log = logging.getLogger(__name__)

SNAPSHOT_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}
SAFETENSORS_DTYPES = {torch.bool: "BOOL", torch.uint8: "U8", torch.int8: "I8", torch.int16: "I16",
                      torch.float16: "F16", torch.bfloat16: "BF16", torch.int32: "I32", torch.float32: "F32",
                      torch.int64: "I64", torch.float64: "F64"}
TORCH_DTYPES = {name: dtype for dtype, name in SAFETENSORS_DTYPES.items()}
MAX_DELTA_FRACTION = 0.5  # a delta above half its full payload saves too little to make some workers fetch both
MAX_UNANNOUNCED = 10  # versions waiting for the site (its outage) past which the next is full: it replaces them
SPILL = ".tensors"  # gathered tensors' bytes, in the version's staging directory until the header is known
SPILL_READ_BYTES = 4 << 20


def publishable_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's state dict as published: detached, and each tied tensor once (the receiver re-ties them)."""
    state, seen = {}, set()
    for name, tensor in model.state_dict().items():
        if tensor.data_ptr() in seen:
            continue
        seen.add(tensor.data_ptr())
        state[name] = tensor.detach()
    return state


def published_dtype(tensor: torch.Tensor, dtype: torch.dtype) -> torch.dtype:
    """Floating-point weights travel in the snapshot dtype; integer buffers as they are."""
    return dtype if tensor.is_floating_point() else tensor.dtype


def payload_layout(state: Mapping[str, torch.Tensor], dtype: torch.dtype,
                   metadata: Mapping[str, str] | None = None) -> tuple[bytes, int]:
    """The safetensors header of ``state`` published in ``dtype`` (with ``metadata``), and the payload's size."""
    infos = [TensorInfo(name, SAFETENSORS_DTYPES[published_dtype(t, dtype)], tuple(t.shape))
             for name, t in state.items()]
    head = header(infos, metadata)
    return head, len(head) + sum(info.nbytes for info in infos)


def stream_state(state: Mapping[str, torch.Tensor], dtype: torch.dtype, head: bytes, cutter: ChunkCutter) -> None:
    """Write ``state`` as one safetensors payload into ``cutter``: its ``head`` (:func:`payload_layout`), then
    each tensor cast to ``dtype`` on the CPU, one at a time (never more than one cast tensor beyond the model)."""
    cutter.write(head)
    for tensor in state.values():
        flat = tensor.detach().to("cpu", published_dtype(tensor, dtype)).contiguous().reshape(-1)
        cutter.write(flat.view(torch.uint8).numpy())


@dataclass(frozen=True)
class TensorSource:
    """What a version is written from: the payload's safetensors ``head``, its whole size, and ``write``, which
    writes the head and then every tensor's bytes into a cutter."""

    head: bytes
    total: int
    write: Callable[[ChunkCutter], None]


def state_source(state: Mapping[str, torch.Tensor], dtype: torch.dtype,
                 metadata: Mapping[str, str] | None = None) -> TensorSource:
    """A state dict: its shapes give the header at once; each tensor is cast as it is written."""
    head, total = payload_layout(state, dtype, metadata)
    return TensorSource(head, total, lambda cutter: stream_state(state, dtype, head, cutter))


def spilled_source(pairs: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype, spill: Path) -> TensorSource:
    """(name, tensor) pairs that come one at a time (a sharded policy gathered tensor by tensor): the header needs
    every shape before the first byte, so each tensor is cast as it comes and its bytes appended to ``spill`` (a
    file on disk, not memory), which ``write`` then reads back after the header."""
    infos = []
    with spill.open("wb") as out:
        for name, tensor in pairs:
            flat = tensor.detach().to("cpu", published_dtype(tensor, dtype)).contiguous().reshape(-1)
            out.write(flat.view(torch.uint8).numpy().data)
            infos.append(TensorInfo(name, SAFETENSORS_DTYPES[flat.dtype], tuple(tensor.shape)))
    head = header(infos)

    def write(cutter: ChunkCutter) -> None:
        cutter.write(head)
        with spill.open("rb") as source:
            while piece := source.read(SPILL_READ_BYTES):
                cutter.write(piece)

    return TensorSource(head, len(head) + sum(info.nbytes for info in infos), write)


def read_tensors(chunks: list[bytes], chunk_bytes: int) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors payload held as chunks, each copied out of them (no joined payload)."""
    payload = ChunkedPayload(chunks, chunk_bytes)
    out = {}
    for info in layout(payload):
        dtype = TORCH_DTYPES[info.dtype]
        raw = bytearray(payload.read(info.begin, info.nbytes))
        tensor = torch.frombuffer(raw, dtype=dtype) if raw else torch.empty(0, dtype=dtype)
        out[info.name] = tensor.reshape(info.shape)
    return out


class SnapshotStore:
    """The learner's published versions, laid out on disk by :mod:`dataplane.broadcast.store` (the one writer
    and reader of that layout): the base (version 0) as a checkpoint archive, then the policy as safetensors in
    ``dtype`` ("bf16" or "fp32"), a delta against the previous version (see the module); ``full_every`` K >= 1
    makes every K-th version full (1: never a delta), 0 (the job's default) none on a schedule.

    What an agent may still ask for stays: the base, the newest ``keep`` versions, every version written
    in the last ``retain_s`` seconds (one an agent started downloading a while ago, or was told about when it
    reconnected, is not pulled from under it), and those not announced yet (``pinned``)."""

    def __init__(self, root: Path, *, job_id: int, chunk_bytes: int = DEFAULT_CHUNK_BYTES, keep: int = 4,
                 retain_s: float = 0.0, dtype: str = "bf16", full_every: int = 0,
                 adapter: LoraSpec | None = None) -> None:
        if dtype not in SNAPSHOT_DTYPES:
            raise ValueError(f"snapshot dtype must be one of {', '.join(SNAPSHOT_DTYPES)}, not {dtype!r}")
        if full_every < 0:
            raise ValueError(f"full_every must be >= 0 (0: no full snapshot on a schedule), not {full_every}")
        self.root, self.job_id, self.chunk_bytes, self.keep = Path(root), job_id, chunk_bytes, keep
        self.retain_s, self.dtype, self.full_every = retain_s, dtype, full_every
        self.adapter = adapter if adapter is not None and adapter.enabled else None
        """A LoRA job's adapter: every version after the base is the adapter's tensors alone (learner/lora.py)."""
        self.format = ADAPTER_FORMAT if self.adapter is not None else "safetensors"
        self.root.mkdir(parents=True, exist_ok=True)
        self._since_full = self._deltas_on_disk()
        self.pinned: Callable[[], Collection[int]] = frozenset
        """The versions written but not announced yet (the learner's outbox): kept until they are."""

    def write(self, weights: torch.nn.Module | Mapping[str, torch.Tensor] | Iterable[tuple[str, torch.Tensor]],
              version: int) -> Manifest:
        """Publish ``weights`` as ``version``: a module, its state dict, or its (name, tensor) pairs one at a time
        (:meth:`learner.step.PolicyTrainer.full_state`: a sharded policy gathered tensor by tensor; iterated to
        the end). Returns the manifest agents get, full or delta."""
        started, dtype = time.perf_counter(), SNAPSHOT_DTYPES[self.dtype]
        with staging(self.root, version) as tmp:
            if self.adapter is not None:  # a few MB: gathered in memory, whatever the weights come as
                state = publishable_state(weights) if isinstance(weights, torch.nn.Module) else weights
                source = state_source(adapter_state(state), dtype, adapter_metadata(self.adapter))
            elif isinstance(weights, torch.nn.Module):
                source = state_source(publishable_state(weights), dtype)
            elif isinstance(weights, Mapping):
                source = state_source(weights, dtype)
            else:
                source = spilled_source(weights, dtype, tmp / SPILL)
            manifest = self._lay_out(source, version, tmp)
            (tmp / SPILL).unlink(missing_ok=True)
        if manifest.kind == "full":
            self._since_full = 0
        elif self._since_full is not None:  # None (a restart that cannot tell) only matters with a schedule
            self._since_full += 1
        self.prune()
        full = manifest.full or manifest
        log.info("snapshot v%d: %s, %s, %d bytes (full %d) in %.2f s", version, manifest.kind, self.dtype,
                 manifest.total_bytes, full.total_bytes, time.perf_counter() - started)
        return manifest

    def _lay_out(self, source: TensorSource, version: int, tmp: Path) -> Manifest:
        """Write the full payload under ``tmp/full`` (and the delta under ``tmp``, if there is a base); keep the
        delta only when it pays, else move the full payload up to be the version itself."""
        base = self._delta_base(version, source.total)
        fields = {"job_id": self.job_id, "version": version, "dtype": self.dtype, "format": self.format}
        delta_cutter = encoder = None
        if base is not None:
            delta_cutter = ChunkCutter(self.chunk_bytes, chunk_files(tmp / CHUNKS))
            encoder = DeltaEncoder(iter_chunks(base[1], base[0]), delta_cutter.write)
        full_cutter = ChunkCutter(self.chunk_bytes, chunk_files(tmp / FULL / CHUNKS, encoder.add if encoder else None))
        source.write(full_cutter)
        full = Manifest(**fields, **full_cutter.finish())
        if encoder is not None:
            encoder.finish()
            delta = Manifest(**fields, **delta_cutter.finish(), kind="delta", base_version=base[0].version,
                             base_sha256=base[0].sha256, encoding=ENCODING, full=full)
            if delta.total_bytes <= MAX_DELTA_FRACTION * full.total_bytes:
                write_manifest(tmp / FULL, full)
                write_manifest(tmp, delta)
                return delta
            log.info("snapshot v%d: the delta is %.0f %% of the full payload; publishing it full", version,
                     100 * delta.total_bytes / full.total_bytes)
        shutil.rmtree(tmp / CHUNKS, ignore_errors=True)
        (tmp / FULL / CHUNKS).rename(tmp / CHUNKS)
        shutil.rmtree(tmp / FULL)
        write_manifest(tmp, full)
        return full

    def _delta_base(self, version: int, total_bytes: int) -> tuple[Manifest, Path] | None:
        """The previous version's full payload, when this version (``total_bytes`` in full) is to be a delta
        against it: no full snapshot is due (on the job's schedule, or because ``MAX_UNANNOUNCED`` versions wait
        for the site), and the previous payload has the same size."""
        if self.full_every and (self._since_full is None or self._since_full + 1 >= self.full_every):
            return None
        if len([v for v in self.pinned() if v > 0]) >= MAX_UNANNOUNCED:
            log.info("snapshot v%d: %d versions wait for the site; publishing this one full (it replaces them)",
                     version, MAX_UNANNOUNCED)
            return None
        earlier = [v for v in list_versions(self.root) if 0 < v < version]
        found = full_payload(self.root, earlier[-1]) if earlier else None
        if found is None:
            return None
        base = found[0]
        if (base.total_bytes, base.chunk_bytes, base.dtype, base.format) != (total_bytes, self.chunk_bytes,
                                                                             self.dtype, self.format):
            return None
        return found

    def _deltas_on_disk(self) -> int | None:
        """Deltas published since the last full snapshot, read back from the store (a restarted learner goes on
        counting); None when that cannot be told: the next version is then full."""
        count = 0
        for version in reversed([v for v in list_versions(self.root) if v > 0]):
            manifest = read_manifest(self.root, version)
            if manifest is None or manifest.kind == "full":
                return count if manifest is not None else None
            count += 1
        return 0 if count == 0 else None

    def forget_after(self, version: int) -> list[int]:
        """Delete the versions newer than ``version`` (a restarted learner's writes the site never heard of, so no
        agent holds them and no delta should apply to them); returns them."""
        dropped = [v for v in list_versions(self.root) if v > version]
        for v in dropped:
            shutil.rmtree(version_dir(self.root, v), ignore_errors=True)
        if dropped:
            self._since_full = self._deltas_on_disk()
        return dropped

    def write_base(self, model_dir: str | Path) -> Manifest:
        """Lay out the checkpoint directory ``model_dir`` as version 0; its sha256 is the job's base digest."""
        payload = basemodel.pack(model_dir)
        manifest = build_manifest(payload, job_id=self.job_id, version=0, chunk_bytes=self.chunk_bytes,
                                  format=basemodel.FORMAT)
        write_version(self.root, manifest, payload)
        return manifest

    def base_manifest(self) -> Manifest | None:
        """The manifest of version 0, if the store has it."""
        return self.manifest(0)

    def manifest(self, version: int) -> Manifest | None:
        """The manifest of ``version``, if the store has it."""
        return read_manifest(self.root, version)

    def prune(self) -> list[int]:
        """Drop what no agent may still ask for (see the class); returns the versions dropped."""
        cutoff = time.time() - self.retain_s
        recent = {v for v in list_versions(self.root) if version_dir(self.root, v).stat().st_mtime >= cutoff}
        return prune_versions(self.root, keep=self.keep, protect={0} | recent | set(self.pinned()))

"""Export a published snapshot as a Hugging Face model directory: what ``from_pretrained`` and vLLM load as is.

A snapshot after version 0 holds only tensors (safetensors); the base snapshot, version 0, holds the job's
checkpoint directory (:mod:`dataplane.basemodel`). An export of version ``v`` is therefore

- every file of the base except its weights (``config.json``, ``generation_config.json``, the tokenizer's
  files, chat template, custom code): taken from version 0's archive, which is read through a seekable view
  of its chunks (:class:`ChunkReader`), so only the chunks holding those small files are fetched;
- ``model.safetensors``: version ``v``'s payload with the header ``save_pretrained`` writes, as trained or
  cast to bf16 (:mod:`dataplane.weights`); ``config.json``'s ``dtype`` says which;
- for a chat job with a system prompt, its chat template with that prompt as the default system message
  (:func:`dataplane.chat.exported_template_files`), so that plain ``transformers`` builds the prompts the job
  trained on: ``tokenizer(prompt)`` for a plain job, ``apply_chat_template([user message],
  add_generation_prompt=True)`` for a chat job (docs/prompts.md).

Version 0 exports the base files unchanged but for that template. The same plan feeds the site's archive (``GET
/api/jobs/<id>/export/``: :func:`tar_stream`, over the learner's snapshot server) and the learner-side
``echo2-learner export`` (:func:`write_directory`, over the snapshot directory on disk); the owner CLI unpacks
the site's archive with :func:`unpack`. The export refuses a base whose ``config.json`` names no
``model_type``: transformers could not tell which architecture to build ("Unrecognized model").
"""

from __future__ import annotations

import io
import json
import os
import shutil
import tarfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from . import basemodel, lora, tensorfile, weights
from .broadcast.store import full_payload
from .chat import PLAIN, TEMPLATE_FILES, PromptFormat, PromptFormatError, exported_template_files
from .snapshot import Manifest, verify_chunk

WEIGHTS_FILE = "model.safetensors"
ADAPTER_WEIGHTS, ADAPTER_CONFIG = "adapter_model.safetensors", "adapter_config.json"  # a LoRA job's, PEFT's names
_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".ckpt", ".h5", ".msgpack", ".gguf",
                    ".safetensors.index.json", ".bin.index.json")
MAX_SMALL_FILE_BYTES = 512 << 20
"""A base file that is not weights but larger than this (a tokenizer is tens of MB) is refused, not held."""
_BLOCK = 512

Fetch = Callable[[int], bytes]
"""Chunk ``i`` of one version, verified against its manifest."""


class ExportError(ValueError):
    """Why a snapshot cannot be exported; ``str(err)`` is one line."""


def is_weights(name: str) -> bool:
    """Whether a base file holds weights (which the snapshot's replace), by its name."""
    return name.endswith(_WEIGHT_SUFFIXES)


class ChunkReader(io.RawIOBase):
    """A version's payload as a seekable binary file: chunk ``i`` is fetched (``fetch(i)``) only when a read
    reaches it; the last one fetched is kept. Wrap it in :class:`io.BufferedReader` for whole reads."""

    def __init__(self, manifest: Manifest, fetch: Fetch) -> None:
        self.manifest, self._fetch, self._pos = manifest, fetch, 0
        self._cached: tuple[int, bytes] = (-1, b"")

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self.manifest.total_bytes}[whence]
        self._pos = max(0, base + offset)
        return self._pos

    def readinto(self, buffer) -> int:  # noqa: ANN001 - a writable buffer
        if self._pos >= self.manifest.total_bytes:
            return 0
        index = self._pos // self.manifest.chunk_bytes
        if self._cached[0] != index:
            self._cached = (index, self._fetch(index))
        data = self._cached[1]
        start = self._pos - index * self.manifest.chunk_bytes
        n = min(len(buffer), len(data) - start)
        buffer[:n] = data[start:start + n]
        self._pos += n
        return n


def open_payload(manifest: Manifest, fetch: Fetch) -> io.BufferedReader:
    return io.BufferedReader(ChunkReader(manifest, fetch), buffer_size=1 << 16)


@dataclass(frozen=True)
class Member:
    """One file of an export: its name, size, and its bytes in pieces (read when written)."""

    name: str
    size: int
    pieces: Callable[[], Iterable[bytes]]


def plan(base: Manifest, fetch_base: Fetch, snapshot: Manifest, fetch_snapshot: Fetch, *,
         dtype: str = "as-trained", prompt_format: PromptFormat = PLAIN) -> list[Member]:
    """The files of the export of ``snapshot`` (version 0: ``base`` itself) in a fixed order, the config first;
    the tokenizer's as the job's ``prompt_format`` prompted the model."""
    if base.version != 0 or base.format != basemodel.FORMAT:
        raise ExportError(f"version {base.version} is not a base snapshot ({basemodel.FORMAT})")
    archive = open_payload(base, fetch_base)
    if snapshot.version == 0:
        if dtype != "as-trained":
            raise ExportError("dtype: version 0 is the base model as published; it is exported unchanged")
        return _prompted(_base_members(archive, keep_weights=True), prompt_format)
    if snapshot.format not in ("safetensors", lora.ADAPTER_FORMAT):
        raise ExportError(f"version {snapshot.version} is {snapshot.format!r}, not safetensors weights")
    if snapshot.kind != "full":
        raise ExportError(f"version {snapshot.version} is a delta: export its full payload (its manifest's "
                          "`full`, served under full/)")
    if snapshot.format == lora.ADAPTER_FORMAT:
        return _adapter_members(archive, snapshot, fetch_snapshot, prompt_format)
    members = _prompted(_base_members(archive, keep_weights=False), prompt_format)
    payload = open_payload(snapshot, fetch_snapshot)
    try:
        written = weights.plan(payload, dtype=dtype)
    except weights.WeightsError as err:
        raise ExportError(f"version {snapshot.version}: {err}") from None
    config = members[0]
    text = _config_with_dtype(b"".join(config.pieces()), written.dtype)
    members[0] = Member(config.name, len(text), lambda: [text])
    members.append(Member(WEIGHTS_FILE, written.size, lambda: written.pieces(payload)))
    return members


def _adapter_members(archive: BinaryIO, snapshot: Manifest, fetch: Fetch, fmt: PromptFormat) -> list[Member]:
    """A LoRA job's version (dataplane/lora.py): the base model whole, and beside its files the adapter in PEFT's
    layout (``adapter_model.safetensors``: the published payload as it is; ``adapter_config.json``): a local model
    with an embedded adapter, which ``AutoModelForCausalLM.from_pretrained(out)`` loads as base + adapter
    (transformers' PEFT integration) and ``PeftModel.from_pretrained(base, out)`` too. The merged model is the
    learner's export's to write (``echo2-learner export --merged``: it needs torch)."""
    payload = open_payload(snapshot, fetch).read()
    try:
        spec = lora.spec_from_metadata(tensorfile.metadata(tensorfile.ChunkedPayload([payload], len(payload))))
    except ValueError as err:
        raise ExportError(f"version {snapshot.version}: {err}") from None
    config = json.dumps({**spec.peft_config(), "peft_type": "LORA", "inference_mode": True,
                         "base_model_name_or_path": None}, indent=2).encode()
    return [*_prompted(_base_members(archive, keep_weights=True), fmt),
            Member(ADAPTER_WEIGHTS, len(payload), lambda: [payload]),
            Member(ADAPTER_CONFIG, len(config), lambda: [config])]


def _base_members(archive: BinaryIO, *, keep_weights: bool) -> list[Member]:
    """The base archive's files (``config.json`` first); weights only with ``keep_weights``, read in place."""
    out: list[Member] = []
    try:
        with tarfile.open(fileobj=archive, mode="r:") as tar:
            for member in tar:
                name = basemodel.checked_member(member, [m.name for m in out])
                if is_weights(name):
                    if keep_weights:
                        out.append(Member(name, member.size, _slice(archive, member.offset_data, member.size)))
                    continue
                if member.size > MAX_SMALL_FILE_BYTES:
                    raise ExportError(f"base file {name} is {member.size} bytes: too large for a config or tokenizer")
                source = tar.extractfile(member)
                assert source is not None  # a regular file
                data = source.read()
                out.append(Member(name, len(data), lambda data=data: [data]))
    except (tarfile.TarError, basemodel.ArchiveError) as err:  # a SnapshotError (fetching a chunk) goes up as is
        raise ExportError(f"base snapshot: {err}") from None
    if not any(m.name == "config.json" for m in out):
        raise ExportError("the base model has no config.json")
    return sorted(out, key=lambda m: (m.name != "config.json", m.name))


def _prompted(members: list[Member], fmt: PromptFormat) -> list[Member]:
    """``members`` with the tokenizer files that hold a chat template rewritten for ``fmt`` (dataplane/chat.py)."""
    files = {m.name: b"".join(m.pieces()) for m in members if m.name in TEMPLATE_FILES}
    try:
        changed = exported_template_files(files, fmt)
    except PromptFormatError as err:
        raise ExportError(str(err)) from None
    return [Member(m.name, len(changed[m.name]), lambda data=changed[m.name]: [data]) if m.name in changed else m
            for m in members]


def _slice(source: BinaryIO, start: int, size: int) -> Callable[[], Iterator[bytes]]:
    def pieces() -> Iterator[bytes]:
        source.seek(start)
        left = size
        while left > 0:
            piece = source.read(min(4 << 20, left))
            if not piece:
                raise ExportError("base snapshot ends early")
            left -= len(piece)
            yield piece

    return pieces


def _config_with_dtype(raw: bytes, dtype: str) -> bytes:
    """The base's ``config.json`` with the exported weights' ``dtype`` (and ``torch_dtype``, if it had one)."""
    try:
        config = json.loads(raw)
    except ValueError as err:
        raise ExportError(f"config.json of the base is not JSON: {err}") from None
    if not isinstance(config, dict) or not config.get("model_type"):
        raise ExportError("config.json of the base names no model_type, so transformers cannot tell which "
                          "architecture to build (save the base with save_pretrained)")
    config["dtype"] = dtype
    if "torch_dtype" in config:
        config["torch_dtype"] = dtype
    return (json.dumps(config, indent=2, sort_keys=True) + "\n").encode()


# --- where the chunks come from: the learner's snapshot directory on disk


def local_version(root: str | Path, version: int) -> tuple[Manifest, Fetch]:
    """Version ``version`` in a snapshot directory (``<snapshot-dir>/job<ID>``): the manifest of its full payload
    (a delta version keeps one beside it) and a reader of its chunks, each verified against the manifest."""
    found = full_payload(Path(root), version)
    if found is None:
        raise ExportError(f"no version {version} in {root}")
    manifest, chunks = found

    def fetch(index: int) -> bytes:
        try:
            data = (chunks / str(index)).read_bytes()
        except OSError as err:
            raise ExportError(f"version {version}: chunk {index}: {err.strerror}") from None
        verify_chunk(manifest, index, data)
        return data

    return manifest, fetch


# --- where the files go: an archive (the site), a directory (the learner), an archive unpacked (the CLI)


def _header(path: str, size: int) -> bytes:
    info = tarfile.TarInfo(path)
    info.size, info.mtime, info.mode, info.type = size, 0, 0o644, tarfile.REGTYPE
    return info.tobuf(format=tarfile.PAX_FORMAT, encoding="utf-8", errors="strict")


def tar_size(members: list[Member], folder: str) -> int:
    """The length of :func:`tar_stream`'s archive (a Content-Length before a byte is sent)."""
    return sum(len(_header(f"{folder}/{m.name}", m.size)) + m.size + (-m.size % _BLOCK) for m in members) + 2 * _BLOCK


def tar_stream(members: list[Member], folder: str) -> Iterator[bytes]:
    """An uncompressed tar of ``members`` inside the directory ``folder`` (safetensors do not compress)."""
    for member in members:
        yield _header(f"{folder}/{member.name}", member.size)
        written = 0
        for piece in member.pieces():
            written += len(piece)
            yield piece
        if written != member.size:
            raise ExportError(f"{member.name}: wrote {written} bytes, planned {member.size}")
        yield b"\0" * (-member.size % _BLOCK)
    yield b"\0" * (2 * _BLOCK)


def write_directory(members: list[Member], destination: str | Path) -> Path:
    """Write ``members`` into ``destination`` (created; it must be empty), each file complete or absent."""
    dest = Path(destination)
    _check_destination(dest)
    for member in members:
        tmp = dest / f".{member.name}.tmp"
        with tmp.open("wb") as out:
            for piece in member.pieces():
                out.write(piece)
        tmp.replace(dest / member.name)
    return dest


def unpack(stream: BinaryIO, destination: str | Path) -> list[str]:
    """Write the files of an export archive (:func:`tar_stream`, read as a stream) into ``destination``
    (created; it must be empty), dropping the archive's folder; refuses anything :func:`tar_stream` does not
    write (links, nested paths, two folders)."""
    dest = Path(destination)
    _check_destination(dest)
    names: list[str] = []
    folder = None
    try:
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                parts = PurePosixPath(member.name).parts
                if not member.isreg() or len(parts) != 2 or folder not in (None, parts[0]):
                    raise ExportError(f"export archive: refusing member {member.name!r}")
                folder = parts[0]
                member.name = parts[1]
                name = basemodel.checked_member(member, names)
                source = tar.extractfile(member)
                assert source is not None
                with (dest / name).open("wb") as out:
                    shutil.copyfileobj(source, out, 1 << 20)
                names.append(name)
    except (tarfile.TarError, basemodel.ArchiveError) as err:
        raise ExportError(f"export archive: {err}") from None
    if "config.json" not in names:
        raise ExportError("export archive: no config.json (incomplete download?)")
    return names


def _check_destination(dest: Path) -> None:
    if dest.exists() and (not dest.is_dir() or any(dest.iterdir())):
        raise ExportError(f"{dest} exists and is not an empty directory")
    dest.mkdir(parents=True, exist_ok=True)

"""The tokenizer's files of a base snapshot, read from its chunks (dataplane/tokenizer_files.py): only those files,
bounded, and only from chunks that make the payload the manifest's digest names."""

from __future__ import annotations

import pytest

from dataplane import basemodel, tokenizer_files
from dataplane.snapshot import build_manifest, split, verify_chunk
from dataplane.tokenizer_files import TokenizerFilesError


def base(directory, files: dict[str, bytes], *, chunk_bytes: int = 512):
    """The base snapshot of a checkpoint directory holding ``files``: (its manifest, a reader of its chunks that
    verifies each, the chunk indices read)."""
    directory.mkdir(exist_ok=True)
    for name, data in files.items():
        (directory / name).write_bytes(data)
    payload = basemodel.pack(directory)
    manifest = build_manifest(payload, job_id=1, version=0, chunk_bytes=chunk_bytes, format=basemodel.FORMAT)
    chunks, read = split(payload, chunk_bytes), []

    def fetch(index: int) -> bytes:
        verify_chunk(manifest, index, chunks[index])
        read.append(index)
        return chunks[index]

    return manifest, fetch, read


CHECKPOINT = {"config.json": b'{"model_type": "llama"}', "tokenizer.json": b'{"version": "1.0"}' * 40,
              "tokenizer_config.json": b'{"tokenizer_class": "PreTrainedTokenizerFast"}',
              "model.safetensors": bytes(5000), "tokenization_custom.py": b"import os\nos.system('id')\n",
              "chat_template.jinja": b"{{ messages }}"}


def test_only_the_tokenizers_files_are_kept(tmp_path) -> None:
    manifest, fetch, read = base(tmp_path / "ckpt", CHECKPOINT)
    files = tokenizer_files.tokenizer_files(manifest, fetch)
    assert set(files) == {"config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"}
    assert files["tokenizer.json"] == CHECKPOINT["tokenizer.json"]
    assert set(read) == set(range(len(manifest.chunks)))  # every chunk, to hash the whole against the digest


def test_chunks_that_are_not_the_digests_bytes_are_refused(tmp_path) -> None:
    """A learner can name a known base's digest over chunks of its own: workers holding that base use their copy,
    so a tokenizer read from those chunks is not theirs."""
    honest, _, _ = base(tmp_path / "honest", CHECKPOINT)
    manifest, fetch, _ = base(tmp_path / "other", {**CHECKPOINT, "tokenizer.json": b'{"version": "2.0"}' * 40})
    lying = manifest.model_copy(update={"sha256": honest.sha256})
    with pytest.raises(TokenizerFilesError, match="do not hash to its digest"):
        tokenizer_files.tokenizer_files(lying, fetch)


def test_a_base_without_a_tokenizer_or_with_one_too_large(tmp_path, monkeypatch) -> None:
    manifest, fetch, _ = base(tmp_path / "bare", {"config.json": b"{}", "model.safetensors": bytes(100)})
    with pytest.raises(TokenizerFilesError, match="holds no tokenizer"):
        tokenizer_files.tokenizer_files(manifest, fetch)

    monkeypatch.setattr(tokenizer_files, "MAX_FILE_BYTES", 512)
    manifest, fetch, _ = base(tmp_path / "large", CHECKPOINT)
    with pytest.raises(TokenizerFilesError, match="tokenizer.json is 720 bytes"):
        tokenizer_files.tokenizer_files(manifest, fetch)


def test_a_later_version_is_no_base(tmp_path) -> None:
    manifest, fetch, _ = base(tmp_path / "ckpt", CHECKPOINT)
    with pytest.raises(TokenizerFilesError, match="is not a base snapshot"):
        tokenizer_files.tokenizer_files(manifest.model_copy(update={"version": 3}), fetch)

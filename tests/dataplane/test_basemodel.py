"""The base snapshot's payload: a checkpoint directory packed deterministically, unpacked byte for byte."""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

import pytest

from dataplane import basemodel


def test_round_trip_gives_byte_identical_files_and_the_same_digest(tiny_model_dir, tmp_path):
    payload = basemodel.pack(tiny_model_dir)
    names = basemodel.unpack(payload, tmp_path / "copy")
    assert names == sorted(p.name for p in tiny_model_dir.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)  # an engine needs all three
    for name in names:
        assert (tmp_path / "copy" / name).read_bytes() == (tiny_model_dir / name).read_bytes()
    assert basemodel.pack(tmp_path / "copy") == payload  # the copy packs to the same bytes: the same digest
    assert basemodel.digest(tmp_path / "copy") == hashlib.sha256(payload).hexdigest()


def test_the_digest_depends_on_the_files_only(tiny_model_dir, tmp_path):
    copy = tmp_path / "model"
    basemodel.unpack(basemodel.pack(tiny_model_dir), copy)
    before = basemodel.digest(copy)
    os.utime(copy / "config.json", (1, 1))
    os.chmod(copy / "tokenizer.json", 0o600)
    (copy / ".gitattributes").write_text("*.safetensors filter=lfs")  # hidden: not carried
    (copy / "original").mkdir()  # subdirectories are not carried either
    (copy / "original" / "consolidated.pth").write_bytes(b"x" * 100)
    assert basemodel.digest(copy) == before
    (copy / "config.json").write_text((copy / "config.json").read_text() + " ")
    assert basemodel.digest(copy) != before


def _archive(*members: tuple[tarfile.TarInfo, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for info, data in members:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


@pytest.mark.parametrize("member", ["../escape", "/etc/passwd", "sub/file", ".hidden", "link"])
def test_unpack_refuses_anything_but_plain_top_level_files(tmp_path, member):
    info = tarfile.TarInfo(member)
    if member == "link":
        info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    with pytest.raises(basemodel.ArchiveError, match="refusing member"):
        basemodel.unpack(_archive((tarfile.TarInfo("config.json"), b"{}"), (info, b"x")), tmp_path / "out")
    assert not (tmp_path / "escape").exists()


def test_garbage_and_empty_directories_are_refused(tmp_path):
    with pytest.raises(basemodel.ArchiveError):
        basemodel.unpack(b"not a tar archive" * 40, tmp_path / "out")
    (tmp_path / "empty").mkdir()
    with pytest.raises(basemodel.ArchiveError, match="holds no files"):
        basemodel.pack(tmp_path / "empty")
    with pytest.raises(basemodel.ArchiveError, match="not a directory"):
        basemodel.pack(tmp_path / "missing")

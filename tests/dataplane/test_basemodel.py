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


def _gnu_sparse(name: str, declared: int) -> bytes:
    """A ~2 KB tar whose old-GNU sparse member declares ``declared`` bytes (one stored byte at the end)."""
    info = tarfile.TarInfo(name)
    info.size = 1
    buf = bytearray(info.tobuf(format=tarfile.GNU_FORMAT))
    buf[156:157] = tarfile.GNUTYPE_SPARSE
    buf[386:398] = tarfile.itn(declared - 1, 12, tarfile.GNU_FORMAT)  # the one block's offset
    buf[398:410] = tarfile.itn(1, 12, tarfile.GNU_FORMAT)  # and its length
    buf[483:495] = tarfile.itn(declared, 12, tarfile.GNU_FORMAT)  # the real size
    buf[148:156] = b" " * 8
    buf[148:156] = b"%06o\0 " % sum(buf[:512])
    return bytes(buf) + b"x" + bytes(511) + bytes(1024)


def _pax_sparse(name: str, declared: int) -> bytes:
    info = tarfile.TarInfo(name)
    info.pax_headers = {"GNU.sparse.size": str(declared), "GNU.sparse.map": f"{declared - 1},1"}
    return _archive((info, b"x"))


@pytest.mark.parametrize("bomb", [_gnu_sparse, _pax_sparse])
def test_a_sparse_member_declaring_50_gib_is_refused_before_a_byte_is_written(tmp_path, bomb):
    payload = bomb("model.safetensors", 50 << 30)
    assert len(payload) <= 10240
    with pytest.raises(basemodel.ArchiveError, match="refusing member"):
        basemodel.unpack(payload, tmp_path / "out")
    assert sum(p.stat().st_size for p in (tmp_path / "out").iterdir()) == 0


@pytest.mark.parametrize("name", ["con\nfig.json", "a\x1b[2Jb", "tab\tname", "nul\x7f"])
def test_names_with_control_characters_are_refused(tmp_path, name):
    with pytest.raises(basemodel.ArchiveError, match="refusing member"):
        basemodel.unpack(_archive((tarfile.TarInfo(name), b"{}")), tmp_path / "out")


@pytest.mark.parametrize("kind", [tarfile.DIRTYPE, tarfile.CHRTYPE, tarfile.FIFOTYPE, tarfile.LNKTYPE])
def test_directories_devices_fifos_and_hard_links_are_refused(tmp_path, kind):
    info = tarfile.TarInfo("model.safetensors")
    info.type = kind
    with pytest.raises(basemodel.ArchiveError, match="refusing member"):
        basemodel.unpack(_archive((info, b"")), tmp_path / "out")


def test_a_member_larger_than_the_archive_is_refused_before_writing(tmp_path):
    """A header may claim more than the payload holds: refused on the claim, not after filling the disk."""
    info = tarfile.TarInfo("model.safetensors")
    info.size = 1 << 40
    payload = info.tobuf(format=tarfile.PAX_FORMAT) + bytes(2048)
    with pytest.raises(basemodel.ArchiveError, match="more than the"):
        basemodel.unpack(payload, tmp_path / "out")
    assert not (tmp_path / "out" / "model.safetensors").exists()

"""The tokenizer's files of a job's base snapshot (version 0), read from its chunks: what the site decodes a
worker's token ids with when it checks a text failure the learner reported (docs/trust.md "Audits the site
checks").

Version 0 is the job's checkpoint directory as one tar (:mod:`dataplane.basemodel`). The archive is read through a
seekable view of its chunks (:func:`dataplane.export.open_payload`): a chunk is fetched only when a read reaches it
(member headers, the files kept), and each chunk is checked against the manifest by the ``fetch`` it is given.
Only the files a tokenizer is loaded from are kept (:data:`TOKENIZER_FILES`: no code, no weights), each and all
together of bounded size; walking the archive stops past a bound on the bytes fetched and on the members, so a
hostile archive costs a bounded read, never memory or a disk without bound.

Then every chunk is read once more, in order, and the whole must hash to the manifest's ``sha256``, the base
digest. A worker installs only bytes that hash to it, and an agent that holds a base of that digest from an
earlier job uses its copy without fetching a chunk (worker_agent/cache.py). A manifest whose chunks are not the
digest's bytes (a learner that names a known base's digest over files of its own) was therefore installed by no
worker, and its tokenizer is not the one they decoded with: it is refused, not used.
"""

from __future__ import annotations

import hashlib
import io
import os
import tarfile

from . import basemodel
from .export import Fetch, open_payload
from .snapshot import Manifest

TOKENIZER_FILES = frozenset({
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "chat_template.jinja", "chat_template.json", "vocab.json", "merges.txt", "vocab.txt", "tokenizer.model",
    "spiece.model", "sentencepiece.bpe.model",
    "config.json",  # AutoTokenizer reads the model type from it when tokenizer_config.json names no class
})
"""What transformers loads a tokenizer from; never a ``.py`` file (no remote code) nor weights."""
VOCABULARIES = ("tokenizer.json", "tokenizer.model", "spiece.model", "sentencepiece.bpe.model", "vocab.json",
                "vocab.txt")
MAX_FILE_BYTES = 64 << 20  # a large vocabulary's tokenizer.json is tens of MB (Gemma's about 34)
MAX_TOTAL_BYTES = 128 << 20
MAX_FETCHED_BYTES = 1 << 30  # chunks read to walk the archive: a header each of a few members, the files kept
MAX_MEMBERS = 4096


class TokenizerFilesError(ValueError):
    """Why the base holds no tokenizer the site will read; ``str(err)`` is one line."""


class _Bounded(io.RawIOBase):
    """The archive with no single read larger than a kept file (tarfile reads a pax header's declared size at once:
    a header claiming a terabyte is refused, not read)."""

    def __init__(self, inner: io.BufferedReader) -> None:
        self.inner = inner

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def read(self, size: int | None = -1) -> bytes:
        if size is None or size < 0 or size > MAX_FILE_BYTES + tarfile.BLOCKSIZE:
            raise TokenizerFilesError(f"base archive: a read of {size} bytes (a header larger than any file kept)")
        return self.inner.read(size)

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        return self.inner.seek(offset, whence)

    def tell(self) -> int:
        return self.inner.tell()


def tokenizer_files(manifest: Manifest, fetch: Fetch) -> dict[str, bytes]:
    """The tokenizer's files (:data:`TOKENIZER_FILES` that the base has), by name, from the base snapshot described
    by ``manifest`` whose chunks ``fetch`` returns verified, once the whole payload hashed to the manifest's digest.
    Raises :class:`TokenizerFilesError` (a fetch's own error, a ``SnapshotError``, goes up as is)."""
    if manifest.version != 0 or manifest.format != basemodel.FORMAT:
        raise TokenizerFilesError(f"version {manifest.version} ({manifest.format}) is not a base snapshot")
    fetched = 0

    def bounded(index: int) -> bytes:
        nonlocal fetched
        data = fetch(index)
        fetched += len(data)
        if fetched > MAX_FETCHED_BYTES:
            raise TokenizerFilesError(f"base archive: more than {MAX_FETCHED_BYTES >> 20} MiB read before its "
                                      "tokenizer's files were found")
        return data

    files: dict[str, bytes] = {}
    seen: list[str] = []
    try:
        with tarfile.open(fileobj=_Bounded(open_payload(manifest, bounded)), mode="r:") as tar:
            for member in tar:
                if len(seen) >= MAX_MEMBERS:
                    raise TokenizerFilesError(f"base archive: more than {MAX_MEMBERS} files")
                name = basemodel.checked_member(member, seen)
                seen.append(name)
                if name in TOKENIZER_FILES:
                    files[name] = _kept(tar, member, sum(map(len, files.values())))
    except (tarfile.TarError, basemodel.ArchiveError) as err:
        raise TokenizerFilesError(f"base snapshot: {err}") from None
    if not any(name in files for name in VOCABULARIES):
        raise TokenizerFilesError(f"the base snapshot holds no tokenizer (none of {', '.join(VOCABULARIES)})")
    whole = hashlib.sha256()
    for index in range(len(manifest.chunks)):
        whole.update(fetch(index))
    if whole.hexdigest() != manifest.sha256:
        raise TokenizerFilesError(f"version 0's chunks do not hash to its digest {manifest.sha256[:12]}...: no "
                                  "worker installed them")
    return files


def _kept(tar: tarfile.TarFile, member: tarfile.TarInfo, held: int) -> bytes:
    if member.size > MAX_FILE_BYTES or held + member.size > MAX_TOTAL_BYTES:
        raise TokenizerFilesError(f"base file {member.name} is {member.size} bytes: past the "
                                  f"{MAX_FILE_BYTES >> 20} MiB a tokenizer file (and {MAX_TOTAL_BYTES >> 20} MiB all "
                                  "of them) may take")
    source = tar.extractfile(member)
    assert source is not None  # a regular file (checked_member)
    data = source.read(member.size)
    if len(data) != member.size:
        raise TokenizerFilesError(f"base file {member.name}: the archive ends early")
    return data

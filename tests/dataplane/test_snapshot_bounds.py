"""Bounded snapshots: a manifest declaring a 4 EiB chunk, more chunks than a hello can list or more
bytes than the site takes is refused naming the field; a server sending far more than a chunk's declared size is
cut off after that size (its ``Content-Length`` refused before a byte is read), memory staying flat; a redirect
is never followed."""

from __future__ import annotations

import os
import tracemalloc

import pytest

from dataplane.snapshot import (
    MAX_CHUNK_BYTES,
    MAX_CHUNKS,
    SnapshotError,
    build_manifest,
    fetch_chunk,
    parse_manifest,
)

from ..lying_servers import LyingHTTPServer

PAYLOAD = os.urandom(100)
MANIFEST = build_manifest(PAYLOAD, job_id=3, version=2)  # one chunk of 100 bytes
LIE = 100 << 20  # what the lying server sends for it


def raw(**changes: object) -> dict:
    return MANIFEST.model_dump(mode="json") | changes


def test_a_manifest_claiming_a_4_eib_chunk_is_refused_naming_the_field() -> None:
    huge = 4 << 60
    chunk = {"index": 0, "size": huge, "sha256": "0" * 64}
    with pytest.raises(SnapshotError, match=r"^manifest: total_bytes: Input should be less than or equal to"):
        parse_manifest(raw(total_bytes=huge, chunk_bytes=huge, chunks=[chunk]))
    with pytest.raises(SnapshotError, match=r"^manifest: chunk_bytes: Input should be less than or equal to "
                                            f"{MAX_CHUNK_BYTES}"):
        parse_manifest(raw(total_bytes=MAX_CHUNK_BYTES + 1, chunk_bytes=MAX_CHUNK_BYTES + 1,
                           chunks=[chunk | {"size": MAX_CHUNK_BYTES + 1}]))


def test_more_chunks_than_a_hello_can_list_and_more_bytes_than_the_site_takes_are_refused() -> None:
    chunks = [{"index": i, "size": 1, "sha256": "0" * 64} for i in range(MAX_CHUNKS + 1)]
    with pytest.raises(SnapshotError, match=f"^manifest: chunks: List should have at most {MAX_CHUNKS} items"):
        parse_manifest(raw(total_bytes=MAX_CHUNKS + 1, chunk_bytes=1, chunks=chunks))
    assert parse_manifest(raw(), max_total_bytes=100).total_bytes == 100
    with pytest.raises(SnapshotError, match="^manifest: total_bytes: 100 bytes, this site takes snapshots of at most "
                                            "99$"):
        parse_manifest(raw(), max_total_bytes=99)


def test_a_delta_whose_full_payload_is_over_the_bound_is_refused() -> None:
    small = {"total_bytes": 10, "chunks": [{"index": 0, "size": 10, "sha256": "0" * 64}]}  # the delta: 10 bytes
    delta = raw(kind="delta", base_version=1, base_sha256="a" * 64, encoding="xor-zstd", full=raw(), **small)
    assert parse_manifest(delta, max_total_bytes=100).full.total_bytes == 100
    with pytest.raises(SnapshotError, match="^manifest: full.total_bytes: 100 bytes"):
        parse_manifest(delta, max_total_bytes=99)


@pytest.mark.parametrize("declare", [True, False], ids=["content-length", "close-delimited"])
def test_a_server_sending_far_more_than_a_chunk_declares_is_cut_off(declare: bool) -> None:
    with LyingHTTPServer(LIE, declare=declare) as server:
        tracemalloc.start()
        try:
            with pytest.raises(SnapshotError) as caught:
                fetch_chunk(server.url(), MANIFEST, 0, timeout=5, retries=1)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
    reason = "announced 104857600 bytes, 100 were declared" if declare else "sent more than the 100 bytes declared"
    assert str(caught.value) == f"chunk 0 of version 2 from {server.url()}chunks/0: the server {reason}"
    assert server.hits == 2  # tried again once (retries=1), each cut off
    assert peak < 2 << 20, f"the reader held {peak} bytes for a 100-byte chunk"
    # The sender got out what the sockets buffer (a few MiB on loopback), never the lie.
    assert server.sent < 32 << 20, server.sent


def test_a_redirect_is_not_followed() -> None:
    with (LyingHTTPServer(100) as target, LyingHTTPServer(0, redirect_to=target.url("/latest/meta-data/")) as server,
          pytest.raises(SnapshotError, match="302") as caught):
        fetch_chunk(server.url(), MANIFEST, 0, timeout=5, retries=3)
    assert caught.value.status == 302 and server.hits == 1  # final: a snapshot server never redirects
    assert target.hits == 0

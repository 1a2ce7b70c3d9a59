"""Fetch a published snapshot chunk by chunk over HTTP, verify each chunk, and return the full weights.

Every request has a timeout; a chunk that fails its hash is fetched again (``dataplane.snapshot.fetch_chunk``).
Nothing is installed unless every chunk verified and the whole payload hashes right.
"""

from __future__ import annotations

from safetensors.torch import load

from dataplane.snapshot import Manifest, assemble, fetch_chunk, parse_manifest


def fetch_snapshot(url: str, manifest_raw: dict, *, timeout: float = 30.0, retries: int = 3) -> tuple[Manifest, dict]:
    manifest = parse_manifest(manifest_raw)
    chunks = {info.index: fetch_chunk(url, manifest, info.index, timeout=timeout, retries=retries)
              for info in manifest.chunks}
    return manifest, load(assemble(manifest, chunks))

"""Fetch a published snapshot chunk by chunk, verify each chunk, and return the full weights.

Every request has a timeout; a chunk that fails its hash is fetched again (up to ``retries`` times).
Nothing is installed unless every chunk verified and the whole payload hashes right.
"""

from __future__ import annotations

import httpx
from safetensors.torch import load

from dataplane.snapshot import Manifest, SnapshotError, assemble, parse_manifest, verify_chunk


def fetch_snapshot(url: str, manifest_raw: dict, *, timeout: float = 30.0, retries: int = 3) -> tuple[Manifest, dict]:
    manifest = parse_manifest(manifest_raw)
    chunks: dict[int, bytes] = {}
    base = url.rstrip("/") + "/"
    with httpx.Client(timeout=timeout) as http:
        for info in manifest.chunks:
            for attempt in range(retries + 1):
                try:
                    response = http.get(f"{base}chunks/{info.index}")
                    response.raise_for_status()
                    verify_chunk(manifest, info.index, response.content)
                except (httpx.HTTPError, SnapshotError) as err:
                    if attempt == retries:
                        raise SnapshotError(f"chunk {info.index} of version {manifest.version}: {err}") from None
                    continue
                chunks[info.index] = response.content
                break
    tensors = load(assemble(manifest, chunks))
    return manifest, tensors

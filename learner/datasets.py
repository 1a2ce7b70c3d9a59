"""The job's data sets on the learner: found, checked against the job's digest, served to the workers.

A task that reads an owner's data set names it by digest (``task.content_digests()``; docs/datasets.md). The
learner holds each before it samples a prompt, from

- ``--dataset PATH`` (a file, or a directory of the data set's files) when its digest is the job's (a data set of
  ``source: learner`` comes only from there), else
- the site, for a data set the owner uploaded (``GET /api/datasets/<digest>/``), unpacked under the job's snapshot
  store (``<snapshot-dir>/job<ID>/data-files/<digest>/``),

registers where it is (:func:`dataplane.dataset.content.register`, where the task reads its rows and the auditor
recomputes rewards alike) and lays its archive out as manifest and chunks under ``<store>/data/<digest>/``, which the
snapshot server serves to the job's credential holders (``GET /data/<digest>/chunks/<i>``). The job's code package
(``task.code``: dataplane/usercode.py) is one of them, always from the site.
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import httpx

from dataplane import basemodel
from dataplane.dataset import content
from dataplane.tasks import TaskAdapter

from .client import SiteClient, SiteError

log = logging.getLogger(__name__)

FILES = "data-files"  # an uploaded data set's files, under the job's store


def download(site: SiteClient, digest: str, *, max_bytes: int = content.MAX_BYTES) -> bytes:
    """The archive of the uploaded data set ``digest`` from the site; SiteError naming it when the site has none."""
    try:
        with site.http.stream("GET", f"datasets/{digest}/") as response:
            if response.status_code != 200:
                response.read()
                raise SiteError(f"dataset {digest[:12]}...: the site answered {response.status_code} "
                                f"{response.text[:200]}")
            payload = bytearray()
            for piece in response.iter_bytes():
                payload += piece
                if len(payload) > max_bytes:
                    raise SiteError(f"dataset {digest[:12]}...: more than {max_bytes} bytes")
    except httpx.TransportError as err:
        raise SiteError(f"dataset {digest[:12]}...: site unreachable ({err})") from None
    if content.sha256(bytes(payload)) != digest:
        raise SiteError(f"dataset {digest[:12]}...: the site's copy does not hash to the digest")
    return bytes(payload)


def lay_out(root: Path, digest: str, payload: bytes, *, job_id: int,
            chunk_bytes: int = content.DEFAULT_CHUNK_BYTES) -> Path:
    """Write ``payload`` (the archive of ``digest``) as ``root/data/<digest>/manifest.json`` + ``chunks/<i>``,
    whole or not at all; returns the directory."""
    final = Path(root) / content.PREFIX / digest
    manifest = content.manifest_for(payload, job_id=job_id, chunk_bytes=chunk_bytes)
    if (final / "manifest.json").is_file() and json.loads((final / "manifest.json").read_text())["sha256"] == digest:
        return final
    tmp = final.with_name(f".{digest}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / "chunks").mkdir(parents=True)
    for info in manifest.chunks:
        start = info.index * manifest.chunk_bytes
        (tmp / "chunks" / str(info.index)).write_bytes(payload[start:start + info.size])
    (tmp / "manifest.json").write_text(manifest.model_dump_json())
    shutil.rmtree(final, ignore_errors=True)
    tmp.rename(final)
    return final


def _local(digest: str, dataset: Path | None) -> Path | None:
    if dataset is None:
        return None
    found = content.digest(dataset)
    if found != digest:
        log.warning("--dataset %s has digest %s..., not the job's %s...", dataset, found[:12], digest[:12])
        return None
    return dataset


def provide(task: TaskAdapter, *, root: Path, job_id: int, dataset: Path | None, site: SiteClient | None) -> list[str]:
    """Hold, register and lay out every data set ``task`` reads (see the module); returns their digests. SiteError
    naming the data set when it is neither at ``dataset`` nor uploaded to the site."""
    digests = task.content_digests()
    for digest in digests:
        what = "code package" if digest == task.code else "data set"  # the code package comes from the site alone
        path = _local(digest, dataset) if digest != task.code else None
        if path is None:
            path = Path(root) / FILES / digest
            if not path.is_dir() or content.digest(path) != digest:
                if site is None and digest == task.code:
                    raise SiteError(f"code: the job's code package {digest[:12]}... comes from the site")
                if site is None:
                    raise SiteError(f"dataset: give --dataset PATH of the job's data set {digest[:12]}...")
                try:
                    payload = download(site, digest)
                except SiteError as err:
                    hint = ("; echo2 job submit uploads a job file's task.code_modules" if digest == task.code else
                            "; a data set the owner did not upload is read from --dataset PATH"
                            f"{f' ({dataset} has another digest)' if dataset else ''}")
                    raise SiteError(f"{err}{hint}") from None
                shutil.rmtree(path, ignore_errors=True)
                basemodel.unpack(payload, path)
        content.register(digest, path)
        lay_out(root, digest, content.pack(path), job_id=job_id)
        log.info("job %s: %s %s... from %s, served to the workers", job_id, what, digest[:12], path)
    return digests

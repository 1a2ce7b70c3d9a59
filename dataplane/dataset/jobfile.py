"""A job file may name its data set by a local path: ``[task.data] path = "data/train.parquet"``.

The site never takes a path (docs/trust.md "Files the site reads"), so reading a job file
(:func:`dataplane.jobfiles.load_job_file`) turns it into content: :func:`resolve_data_path` replaces ``data.path``
by ``data.digest`` (the digest of the files at that path, relative to the job file) and registers where this
machine holds them (:func:`~dataplane.dataset.content.register`). ``echo2 job submit`` then uploads their archive
(:func:`upload_path`; ``POST /api/datasets/``) unless ``data.source`` is ``learner`` (the learner reads them:
``echo2-learner --dataset PATH``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .content import DatasetError, digest, locate, register


def _data(raw: dict[str, Any]) -> dict[str, Any] | None:
    data = raw["task"].get("data") if isinstance(raw.get("task"), dict) else None
    return data if isinstance(data, dict) else None


def resolve_data_path(raw: dict[str, Any], *, base: Path) -> dict[str, Any]:
    """``raw`` (a job file's settings) with ``task.data.path`` replaced by ``task.data.digest``, the files registered
    as this machine's copy of it. DatasetError naming ``task.data.path`` when it is no data set."""
    data = _data(raw)
    if data is None or "path" not in data:
        return raw
    if not isinstance(data["path"], str) or not data["path"]:
        raise DatasetError("task.data.path: must be the path of the data set's file or folder")
    path = Path(data["path"]).expanduser()
    path = path if path.is_absolute() else base / path
    try:
        found = digest(path)
    except (DatasetError, OSError) as err:
        raise DatasetError(f"task.data.path: {str(err).removeprefix('dataset: ')}") from None
    if "digest" in data and data["digest"] != found:
        raise DatasetError(f"task.data.digest: {data['digest'][:12]}... is not the digest of {path} ({found[:12]}...)")
    register(found, path)
    out = copy.deepcopy(raw)
    out["task"]["data"] = {k: v for k, v in data.items() if k != "path"} | {"digest": found}
    return out


def upload_path(raw: dict[str, Any]) -> Path | None:
    """The files ``echo2 job submit`` uploads for ``raw``'s data set: those this machine holds for its digest (a job
    file's ``data.path``), unless its learner serves them (``source`` learner)."""
    data = _data(raw)
    if data is None or data.get("source") == "learner" or not isinstance(data.get("digest"), str):
        return None
    return locate(data["digest"])

"""A job file may name its data set by a local path: ``[task.data] path = "data/train.parquet"``.

The site never takes a path (docs/trust.md "Files the site reads"), so ``echo2 job submit`` turns it into content
before anything is sent: :func:`resolve_data_path` replaces ``data.path`` by ``data.digest`` (the digest of the
files at that path, relative to the job file) and says which files to upload; the CLI uploads their archive
(``POST /api/datasets/``) unless ``data.source`` is ``learner`` (then the learner reads them: ``echo2-learner
--dataset PATH``).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from .content import DatasetError, digest


def resolve_data_path(raw: dict[str, Any], *, base: Path) -> tuple[dict[str, Any], Path | None]:
    """``raw`` (a job file's settings) with ``task.data.path`` replaced by ``task.data.digest``, and the path to
    upload (None: nothing to upload, either no path or ``source`` learner). DatasetError naming ``task.data.path``
    when it is no data set."""
    data = (raw.get("task") or {}).get("data") if isinstance(raw.get("task"), dict) else None
    if not isinstance(data, dict) or "path" not in data:
        return raw, None
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
    out = copy.deepcopy(raw)
    out["task"]["data"] = {k: v for k, v in data.items() if k != "path"} | {"digest": found}
    return out, None if data.get("source") == "learner" else path

"""The job owner's code for the workers, shipped by content: a **code package**.

A task that runs the owner's code where the workers are (a reward function with ``scored_on = "worker"``, a
verifiers environment) names it as an import, ``pkg.module:fn``. So that no provider installs an owner's code by
hand, a job file lists the modules to ship (``task.code_modules = ["mypkg"]``); ``echo2 job submit`` packs their
source files into a zip (:func:`pack`: names sorted, no dates, stored uncompressed, so the same sources always give
the same bytes) and the task names the package by the sha256 of its content, ``task.code``.

The package travels as a data set of one file, :data:`ARCHIVE` (docs/datasets.md): its digest is a data set digest,
so the site stores the upload as it stores data sets (owner-only, within the owner's quota), the learner fetches it
and serves it at ``/data/<digest>/`` to the job's credential holders, and an agent fetches it with the job's data
sets, every chunk and the whole checked against the digest, into its cache. Nothing imports it until
:func:`activate`, which a task calls from ``prepare(allow_user_code=True)``: only where the provider opted in
(``echo2-agent run --allow-user-code``), and on the learner (the owner's machine). Python imports from the zip
itself (``zipimport``), so only pure-Python modules (and files read through ``importlib.resources``) ship; a native
extension is refused when packing.
"""

from __future__ import annotations

import hashlib
import importlib
import io
import re
import sys
import tempfile
import threading
import zipfile
from pathlib import Path, PurePosixPath
from typing import Any

from .dataset.content import DatasetError, check_digest, digest, locate, register

ARCHIVE = "echo2-code.zip"
"""The one file of a code package's data set."""
MAX_BYTES = 8 << 20
"""The most bytes of source a package holds (uncompressed: it is stored so)."""
MAX_FILES = 1000
_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_NATIVE = (".so", ".pyd", ".dll", ".dylib")
_SKIPPED_DIRS = ("__pycache__",)
_DATE = (1980, 1, 1, 0, 0, 0)

_active: list[str] = []  # the packages on this process's import path, by their zip's path
_lock = threading.Lock()


class CodeError(ValueError):
    """A code package that cannot be packed, checked or activated; the message names the field or the file."""


def parse_code(value: Any, *, field: str = "code") -> str | None:
    """A task spec's ``code``: None, or the package's digest (sha256, lowercase hex)."""
    if value is None:
        return None
    try:
        return check_digest(value, field=field)
    except DatasetError:
        raise CodeError(f"{field}: must be the code package's sha256 in lowercase hex (64 characters); a job file "
                        "lists the modules instead (task.code_modules), which echo2 job submit packs") from None


# -- packing (echo2 job submit) -----------------------------------------------------------------------------------


def module_files(name: str, roots: list[Path]) -> dict[str, Path]:
    """The files that ship module ``name`` (dotted), found under the first of ``roots`` that holds it, as archive
    name -> path: a package's directory whole (``__pycache__`` and hidden names left out), or a module's file; with
    the ``__init__.py`` of each package above it. CodeError when no root holds it."""
    if not isinstance(name, str) or not _MODULE.match(name):
        raise CodeError(f"{name!r} is not a module name (dotted identifiers: 'mypkg', 'mypkg.rewards')")
    parts = name.split(".")
    for root in roots:
        target = root.joinpath(*parts)
        found: dict[str, Path] = {}
        if (target / "__init__.py").is_file():
            for path in sorted(target.rglob("*")):
                rel = path.relative_to(root)
                if path.is_file() and not any(p.startswith(".") or p in _SKIPPED_DIRS for p in rel.parts) \
                        and path.suffix != ".pyc":
                    found[rel.as_posix()] = path
        elif target.with_suffix(".py").is_file():
            found[f"{'/'.join(parts)}.py"] = target.with_suffix(".py")
        else:
            continue
        for depth in range(1, len(parts)):
            init = root.joinpath(*parts[:depth], "__init__.py")
            if init.is_file():
                found[PurePosixPath(*parts[:depth], "__init__.py").as_posix()] = init
        native = [n for n in found if n.endswith(_NATIVE)]
        if native:
            raise CodeError(f"{name}: {native[0]} is a native extension, which a code package cannot ship (Python "
                            "imports a package from its zip); install that on the workers instead")
        return found
    raise CodeError(f"no module {name!r} under {', '.join(str(r) for r in roots)} (named as imported from there)")


def pack(modules: list[str], roots: list[Path]) -> bytes:
    """The package of ``modules`` (found under ``roots``: :func:`module_files`): a zip of their files, the same
    bytes for the same sources wherever they lie. CodeError when one is missing or it passes the bounds."""
    if not isinstance(modules, list) or not modules:
        raise CodeError("name the modules to ship, e.g. [\"mypkg\", \"helpers\"]")
    files: dict[str, Path] = {}
    for name in modules:
        for arcname, path in module_files(name, roots).items():
            if files.setdefault(arcname, path).resolve() != path.resolve():
                raise CodeError(f"{arcname} comes from both {files[arcname]} and {path}")
    if len(files) > MAX_FILES:
        raise CodeError(f"{len(files)} files, a code package holds at most {MAX_FILES}")
    # every directory has its entry: zipimport finds a namespace package (a directory without __init__.py, as an
    # owner's checkout often has: examples/envs/) only by it
    folders = {f"{parent}/" for name in files for parent in list(PurePosixPath(name).parents)[:-1]}
    out = io.BytesIO()
    total = 0
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as archive:
        for arcname in sorted([*files, *folders]):
            info = zipfile.ZipInfo(arcname, date_time=_DATE)
            info.create_system = 3
            if arcname in folders:
                info.external_attr = (0o40755 << 16) | 0x10
                archive.writestr(info, b"")
                continue
            data = files[arcname].read_bytes()
            total += len(data)
            if total > MAX_BYTES:
                raise CodeError(f"more than {MAX_BYTES} bytes of files (at {arcname}): ship source, install the rest "
                                "on the workers")
            info.external_attr = 0o644 << 16
            archive.writestr(info, data)
    return out.getvalue()


def resolve_code_modules(raw: dict[str, Any], *, roots: list[Path]) -> dict[str, Any]:
    """``raw`` (a job file's settings) with ``task.code_modules`` replaced by ``task.code``, the digest of their
    package, which is written to the temporary directory and registered as this machine's copy of it (``echo2 job
    submit`` uploads it from there: :func:`upload_path`). CodeError naming ``task.code_modules`` otherwise."""
    task = raw.get("task")
    if not isinstance(task, dict) or "code_modules" not in task:
        return raw
    try:
        payload = pack(task["code_modules"], roots)
    except (CodeError, OSError) as err:
        raise CodeError(f"task.code_modules: {err}") from None
    path = Path(tempfile.gettempdir()) / f"echo2-code-{hashlib.sha256(payload).hexdigest()[:24]}" / ARCHIVE
    path.parent.mkdir(exist_ok=True)  # the same sources, the same file: written again, never a second copy
    path.write_bytes(payload)
    found = digest(path)
    if task.get("code") not in (None, found):
        raise CodeError(f"task.code: {str(task['code'])[:12]}... is not the digest of task.code_modules "
                        f"({found[:12]}...)")
    register(found, path)
    out = dict(raw)
    out["task"] = {k: v for k, v in task.items() if k != "code_modules"} | {"code": found}
    return out


def upload_path(raw: dict[str, Any]) -> Path | None:
    """The package file ``echo2 job submit`` uploads for ``raw``: the one this machine holds for ``task.code``."""
    task = raw.get("task")
    code = task.get("code") if isinstance(task, dict) else None
    return locate(code) if isinstance(code, str) and re.fullmatch(r"[0-9a-f]{64}", code) else None


# -- checking and importing (the learner, an agent that opted in) -------------------------------------------------


def check_package(payload: bytes) -> list[str]:
    """The top-level names (packages and modules) of a package, if ``payload`` is one :func:`pack` could have
    written: relative plain paths (a directory's entry empty), no duplicates, within the bounds; else CodeError."""
    tops: list[str] = []
    seen: set[str] = set()
    total = 0
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            infos = archive.infolist()
            count = sum(not info.is_dir() for info in infos)
            if not count or count > MAX_FILES or len(infos) > 2 * MAX_FILES:
                raise CodeError(f"code package: {count} files, 1 to {MAX_FILES}")
            for info in infos:
                path = PurePosixPath(info.filename)
                if ((info.is_dir() and info.file_size) or path.is_absolute() or "\\" in info.filename
                        or info.filename in seen or any(p in (".", "..") or p.startswith(".") for p in path.parts)
                        or "//" in info.filename):
                    raise CodeError(f"code package: refusing member {info.filename!r}")
                seen.add(info.filename)
                total += info.file_size
                if total > MAX_BYTES:
                    raise CodeError(f"code package: more than {MAX_BYTES} bytes")
                top = path.parts[0].removesuffix(".py") if len(path.parts) == 1 else path.parts[0]
                if top not in tops:
                    tops.append(top)
    except (zipfile.BadZipFile, OSError) as err:
        raise CodeError(f"code package: not a zip ({err})") from None
    return tops


def activate(code: str) -> Path | None:
    """Put the package ``code`` first on this process's import path, if this machine holds it (else None: the
    owner's modules import as they would without it, from the path or the working directory). A package activated
    before is taken off the path, and the modules of this package's top-level names that were imported from
    elsewhere are forgotten, so the job's imports get its own code. Call it only where the job's code may run."""
    where = locate(check_digest(code, field="code"))
    if where is None:
        return None
    path = where / ARCHIVE if where.is_dir() else where
    if path.name != ARCHIVE or not path.is_file():
        raise CodeError(f"code: the copy of {code[:12]}... at {where} holds no {ARCHIVE}")
    tops = check_package(path.read_bytes())
    entry = str(path)
    with _lock:
        for old in [p for p in _active if p != entry]:
            _active.remove(old)
            if old in sys.path:
                sys.path.remove(old)
        if entry not in sys.path:
            sys.path.insert(0, entry)
        if entry not in _active:
            _active.append(entry)
        for name in [n for n in sys.modules if n.split(".")[0] in tops]:
            origin = getattr(sys.modules[name], "__file__", None) or ""
            if not origin.startswith(entry + "/"):
                del sys.modules[name]
        importlib.invalidate_caches()
    return path


def deactivate() -> None:
    """Take every package :func:`activate` put on this process's import path off it again (its modules stay
    imported: functions already loaded keep working)."""
    with _lock:
        for entry in _active:
            if entry in sys.path:
                sys.path.remove(entry)
        _active.clear()
        importlib.invalidate_caches()

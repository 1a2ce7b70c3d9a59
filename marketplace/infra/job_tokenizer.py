"""The job's tokenizer at the site, for its own check of text failures (docs/trust.md "Audits the site checks").

The tokenizer the workers decode with is the one inside the job's version 0 (the base archive every worker
installed, or held already under its digest), which the site knows by the manifest it recorded when the learner
published it. So:

- **The files** come from the learner's snapshot server like any worker's download (``infra/learner_fetch.py``:
  the site's own credential for version 0, every chunk checked against that manifest), only the tokenizer's files
  are kept (``dataplane/tokenizer_files.py``: no code, no weights, each and all bounded), and they are used only
  once the whole payload hashed to the base digest; all within ``ECHO2_AUDIT_TOKENIZER_READ_S``. The owner's
  ``model_dir`` is never read: it is his to change.
- **Cached** by the base digest, on the site's disk (``ECHO2_AUDIT_TOKENIZER_DIR``, at most :data:`DISK_ENTRIES`
  bases, the least recently used out first): every job on that base, in every site process, decodes with them
  without another read. A read that failed is remembered for :data:`FAILURE_MEMORY_S` per manifest, so a learner
  that serves bad chunks costs the site one read, not one per report.
- **The verdicts** are computed in a child process (``infra/tokenizer_child.py``) with a cleared environment,
  killed after :data:`RUN_TIMEOUT_S`: the files are the owner's, and what they cost to load and run (a regex, a
  chat template) must not hold a Celery worker or reach the site's secrets.

Every failure is a :class:`TokenizerUnavailable` whose text says why, for the verdict's reason.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from django.conf import settings

from dataplane import basemodel
from dataplane.snapshot import SnapshotError, parse_manifest
from dataplane.tokenizer_files import TokenizerFilesError, tokenizer_files

from ..core.audit_checks import CONSISTENT, REFUSED, UNVERIFIED, VERIFIED, SiteCheck
from .learner_fetch import version_source

log = logging.getLogger(__name__)
RUN_TIMEOUT_S = 60.0  # the child: start (transformers imported), load the tokenizer, decode
DISK_ENTRIES = 16
FAILURE_MEMORY_S = 600.0
_ROOT = str(Path(__file__).resolve().parents[2])  # where ``marketplace`` and ``dataplane`` are found
_failed: dict[str, tuple[float, str]] = {}  # manifest's own sha256 -> (remembered until, why)
_lock = threading.Lock()


class TokenizerUnavailable(Exception):
    """Why the site has no tokenizer of the job to decode with (one line)."""


def read_budget_s() -> float:
    return float(settings.ECHO2["AUDIT_TOKENIZER_READ_S"])


def base_tokenizer(*, job_id: int, secret: str, url: str, manifest: Any) -> Path:
    """The folder of the tokenizer's files of the job's version 0, published at ``url`` with ``manifest`` (as the
    site recorded it): cached under the base digest, else read from the learner."""
    try:
        parsed = parse_manifest(manifest)
    except SnapshotError as err:
        raise TokenizerUnavailable(f"the base snapshot's manifest: {err}") from None
    if parsed.version != 0 or parsed.format != basemodel.FORMAT:
        raise TokenizerUnavailable(f"version {parsed.version} ({parsed.format}) is not a base snapshot")
    root = Path(settings.ECHO2["AUDIT_TOKENIZER_DIR"])
    folder = root / parsed.sha256  # a sha256 in hex (the manifest's schema): a plain name
    if folder.is_dir():
        with contextlib.suppress(OSError):  # evicted meanwhile by another process: the child says so
            os.utime(folder)  # the least recently used base goes first
        return folder
    key = hashlib.sha256(parsed.model_dump_json().encode()).hexdigest()
    with _lock:
        until, why = _failed.get(key, (0.0, ""))
    if until > time.monotonic():
        raise TokenizerUnavailable(f"{why} (a read of this base failed less than {FAILURE_MEMORY_S:g} s ago)")
    try:
        parsed, fetch = version_source(job_id=job_id, secret=secret, url=url, manifest=manifest, highest=0,
                                       deadline=time.monotonic() + read_budget_s())
        files = tokenizer_files(parsed, fetch)
    except (SnapshotError, TokenizerFilesError) as err:
        log.warning("job %s: version 0's tokenizer not read: %s", job_id, err)
        why = f"version 0's tokenizer could not be read from the learner: {_said(err)}"
        with _lock:
            for stale in [k for k, (t, _) in _failed.items() if t <= time.monotonic()]:
                del _failed[stale]
            _failed[key] = (time.monotonic() + FAILURE_MEMORY_S, why)
        raise TokenizerUnavailable(why) from None
    try:
        _store(root, folder, files)
    except OSError as err:
        raise TokenizerUnavailable(f"the site could not keep version 0's tokenizer files in {root}: {err}") from None
    return folder


def _said(err: SnapshotError | TokenizerFilesError) -> str:
    """What a provider is told of a failed read: what went wrong, not the learner's answers (the log has them)."""
    if isinstance(err, TokenizerFilesError):
        return str(err)[:200]
    if "sha256 mismatch" in str(err):
        return "a chunk does not match the manifest the site recorded (sha256 mismatch)"
    return f"its snapshot server refused ({err.status})" if err.status else "its snapshot server could not be reached"


def _store(root: Path, folder: Path, files: dict[str, bytes]) -> None:
    """Put ``files`` in ``folder`` whole or not at all (written beside it, then renamed), and keep at most
    :data:`DISK_ENTRIES` bases in ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=root))
    for name, data in files.items():  # plain names of an allow-list (dataplane/tokenizer_files.py)
        (staging / name).write_bytes(data)
    try:
        staging.rename(folder)
    except OSError:  # another process stored it first: the same bytes (they hash to the digest)
        shutil.rmtree(staging, ignore_errors=True)
    entries = sorted((p for p in root.iterdir() if not p.name.startswith(".")), key=lambda p: p.stat().st_mtime)
    for old in entries[:-DISK_ENTRIES]:
        shutil.rmtree(old, ignore_errors=True)


def forget_failures() -> None:
    with _lock:
        _failed.clear()


def decoded_verdicts(folder: Path, *, prompt_format: Any, items: list[dict[str, Any]],
                     timeout: float = RUN_TIMEOUT_S) -> list[SiteCheck]:
    """The site's verdict on each of ``items`` (``audit_checks.text_item``) with the tokenizer in ``folder``
    (:func:`base_tokenizer`), computed in a child process killed after ``timeout`` seconds."""
    with tempfile.TemporaryDirectory(prefix="echo2-tokenizer-") as work:
        home = Path(work)
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "PYTHONPATH": _ROOT, "HOME": str(home),
               "HF_HOME": str(home / "hf"), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
               "TOKENIZERS_PARALLELISM": "false", "LANG": "C.UTF-8"}
        request = json.dumps({"prompt_format": prompt_format, "items": items})
        try:
            done = subprocess.run([sys.executable, "-P", "-m", "marketplace.infra.tokenizer_child", str(folder)],
                                  input=request, capture_output=True, text=True, timeout=timeout, env=env, cwd=work)
        except subprocess.TimeoutExpired:
            raise TokenizerUnavailable(f"decoding with the job's tokenizer took more than {timeout:g} s") from None
        except OSError as err:
            raise TokenizerUnavailable(f"the site's decoding process did not start: {err}") from None
    return _answer(done, len(items))


def _answer(done: subprocess.CompletedProcess, expected: int) -> list[SiteCheck]:
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1]) if done.returncode == 0 and lines else None
    except ValueError:
        answer = None
    if isinstance(answer, dict) and isinstance(answer.get("error"), str):
        raise TokenizerUnavailable(answer["error"][:300])
    verdicts = answer.get("verdicts") if isinstance(answer, dict) else None
    statuses = (VERIFIED, CONSISTENT, UNVERIFIED, REFUSED)
    if (not isinstance(verdicts, list) or len(verdicts) != expected
            or not all(isinstance(v, list) and len(v) == 2 and v[0] in statuses and isinstance(v[1], str)
                       for v in verdicts)):
        tail = done.stderr.strip().splitlines()[-1:] or [""]
        raise TokenizerUnavailable(f"the site's decoding process failed (exit {done.returncode}: {tail[0][:200]})")
    return [SiteCheck(status, why) for status, why in verdicts]

"""A full disk under the learner: training goes on, the write is tried again later, and the site is told.

A snapshot or a checkpoint that meets ``ENOSPC`` (or a quota, ``EDQUOT``) used to end the learner, with no
supervisor to restart it: the job stalled. Now the publisher drops what the store's retention allows first and
tries once more; failing again, it skips publications for a back-off (10 s doubling to 5 minutes: a version every
kappa steps would otherwise write gigabytes into a full disk at every step) and each step's report carries
:func:`full_line`, which the job page and ``echo2 job status`` show, until a write fits again. A checkpoint that
does not fit leaves the last one intact (written to a temporary file, then renamed): its entries stay unacknowledged
and go with the next checkpoint, so none is lost or trained twice after a restart.
"""

from __future__ import annotations

import errno
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path

FULL_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


def is_full(err: BaseException) -> bool:
    """Whether ``err`` says the disk (or the quota) has no room left."""
    return isinstance(err, OSError) and err.errno in FULL_ERRNOS


def full_line(what: str, *, needed_bytes: int, root: Path) -> str:
    """What the job page says: ``"snapshot store full: 840 MB needed, 12 MB free in /var/echo2/snapshots/job3"``."""
    try:
        free = shutil.disk_usage(root).free
    except OSError:
        free = None
    mb = math.ceil(max(needed_bytes, 0) / 1e6)
    return f"{what} full: {mb} MB needed" + (f", {free / 1e6:.0f} MB free in {root}" if free is not None else "")


class Backoff:
    """When to try a write that found no room again: ``first`` seconds after the first failure, doubling to ``cap``;
    a write that fits resets it."""

    def __init__(self, *, first: float = 10.0, cap: float = 300.0, clock: Callable[[], float] = time.monotonic):
        self.first, self.cap, self.clock = first, cap, clock
        self.wait = 0.0
        self.until = -math.inf

    def due(self) -> bool:
        return self.clock() >= self.until

    def failed(self) -> float:
        """Note a failure; returns the seconds until the next try."""
        self.wait = self.first if not self.wait else min(self.cap, 2 * self.wait)
        self.until = self.clock() + self.wait
        return self.wait

    def succeeded(self) -> None:
        self.wait, self.until = 0.0, -math.inf

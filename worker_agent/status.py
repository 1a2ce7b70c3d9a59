"""What the agent tells the person running it: one line when what it does changes, else a summary now and then.

Heartbeats tell the site what the agent does (:mod:`worker_agent.state`); these lines tell its provider, in the
agent's log. Like the heartbeat's state, a line is derived from the session's facts at one instant
(:func:`describe` over a :class:`View`), never kept up to date by hand, and paced (:func:`due`): a change is
printed at once but no sooner than ``MIN_GAP_S`` after the previous line, so a flapping state cannot flood the log;
a download's progress at most every ``PROGRESS_EVERY_S``; otherwise one summary line every ``every`` seconds
(``echo2-agent run --status-every``; 0: changes only). A lost connection is said by the session itself (with
when it reconnects), so nothing is printed here while disconnected.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from dataplane.messages import WorkerState

log = logging.getLogger("echo2.agent")

MIN_GAP_S = 2.0  # least time between two lines, whatever changed
PROGRESS_EVERY_S = 5.0  # a download's progress, at most this often
GENERATING_HOLD_S = 10.0  # a group accepted this recently: still "generating" between batches, not idle
POLL_S = 0.5
FILE_EVERY_S = 2.0  # the status file (echo2-agent status) is rewritten this often


@dataclass
class Tally:
    """What the site accepted from this agent, in all (the rates are differences over the time between lines)."""

    groups: int = 0
    trajectories: int = 0
    tokens: int = 0  # completion tokens
    last_at: float | None = None  # time.monotonic() of the last accepted group
    refused: int = 0  # our frames the site refused for the transport's sake (each sent again; honest pacing: 0)
    earned_usd: float | None = None  # what the site's ledger billed for this worker so far (its last answer's)

    def add(self, *, trajectories: int, tokens: int) -> None:
        self.groups += 1
        self.trajectories += trajectories
        self.tokens += tokens
        self.last_at = time.monotonic()


@dataclass(frozen=True)
class Install:
    """A snapshot being downloaded or loaded: ``chunks`` of ``total`` held (None: not known, an HTTP download)."""

    version: int
    seconds: float
    chunks: int | None = None
    total: int | None = None


@dataclass(frozen=True)
class View:
    """The session's facts at one instant, as :func:`describe` needs them."""

    connected: bool
    state: WorkerState  # what the heartbeat reports (worker_agent/state.py)
    job_id: int | None = None  # the job it is assigned to
    version: int | None = None  # installed in the job's engine; None: no engine yet
    wanted: int = 0  # the version to reach before generating
    installs: tuple[Install, ...] = ()  # the job's, running
    released: str | None = None  # why the site last released it (while not assigned)
    failure: str | None = None  # the rollout loop's last crash
    refused: bool = False  # it will not serve the job (the rollout loop said why in ``failure``)
    no_work: bool = False  # the site's last answer to a lease request was "no work"
    recent_work: bool = False  # a group was accepted within GENERATING_HOLD_S
    last_install: str | None = None  # the job's newest install, said with the generating line ("v3 in 0.8 s ...")


@dataclass(frozen=True)
class Status:
    key: tuple  # what the agent does: a different key is a change
    text: str
    progress: bool = False  # a download under way: its text may be repeated sooner than a summary


def describe(view: View) -> Status | None:
    """The line for ``view``; None while disconnected (the session says when it reconnects)."""
    if not view.connected:
        return None
    job = view.job_id
    if job is None:
        why = view.released or "waiting for the scheduler to pick this machine"
        return Status(("idle", "not activated"), f"idle: not activated ({why})")
    if view.state == "failed" and view.refused:
        return Status(("failed", job), f"job {job}: this worker {view.failure} (waiting for the site to release it)")
    if view.state == "failed":
        return Status(("failed", job), f"job {job}: the rollout loop failed ({view.failure}); restarting it")
    if view.state == "generating" or (view.state == "idle" and view.recent_work and view.version is not None):
        return Status(("generating", job), f"generating for job {job} under v{view.version}"
                      + (f"; installing v{view.installs[-1].version}" if view.installs else "")
                      + (f" ({view.last_install})" if view.last_install else ""))
    if view.installs and (view.state == "loading" or view.version is None):
        return Status(("loading", job), f"loading job {job}'s model: base snapshot, {_progress(view.installs[0])}",
                      progress=True)
    if view.state == "installing" and view.installs:
        newest = view.installs[-1]
        return Status(("installing", job), f"installing v{newest.version} for job {job}: {_progress(newest)}",
                      progress=True)
    if view.version is None:
        return Status(("idle", job, "base"), f"idle: job {job}'s base snapshot is not here yet (the learner may not "
                      "have published it; asking the site)")
    if view.version < view.wanted:
        return Status(("idle", job, "version"), f"idle: waiting for snapshot v{view.wanted} of job {job} "
                      f"(v{view.version} installed; asking the site)")
    if view.no_work:
        return Status(("idle", job, "no work"), f"idle: job {job} has no prompts to lease for v{view.version} (the "
                      "learner has queued none; asking again)")
    return Status(("idle", job, "ready"), f"idle: ready for job {job} under v{view.version}, asking for prompts")


def _progress(install: Install) -> str:
    done = "downloaded" if install.chunks is not None and install.chunks == install.total else None
    if done is None and install.chunks is not None and install.total:
        done = f"{install.chunks}/{install.total} chunks"
    return f"{done or 'under way'}, {_span(install.seconds)}"  # HTTP: no chunk count, then the engine is built


def _span(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def due(status: Status, *, last: Status | None, last_at: float | None, now: float, every: float,
        min_gap: float = MIN_GAP_S, progress_every: float = PROGRESS_EVERY_S) -> bool:
    """Whether to print ``status`` at ``now``: the first at once; a change once ``min_gap`` passed since the last
    line; new progress once ``progress_every`` passed; the same again once ``every`` passed (0: never)."""
    if last is None or last_at is None:
        return True
    elapsed = now - last_at
    if status.key != last.key:
        return elapsed >= min_gap
    if status.progress and status.text != last.text and elapsed >= progress_every:
        return True
    return every > 0 and elapsed >= every


@dataclass
class Reporter:
    """Turns views into paced lines; rates cover the time since the previous line, when it was generating too."""

    every: float = 30.0
    last: Status | None = None
    last_at: float | None = None
    since: float | None = None  # when the current key began
    mark: tuple[int, int, int] = (0, 0, 0)  # the tally (groups, trajectories, tokens) at the last line
    began: dict[tuple[int, int], float] = field(default_factory=dict)  # install -> when first seen

    def line(self, view: View, tally: Tally, now: float) -> str | None:
        status = describe(view)
        if status is None:  # disconnected: the next connection starts afresh
            self.last = self.last_at = None
            return None
        if not due(status, last=self.last, last_at=self.last_at, now=now, every=self.every):
            return None
        changed = self.last is None or status.key != self.last.key
        text = status.text
        if not changed and status.key[0] == "generating":
            text += self._rates(tally, now - self.last_at)
        elif not changed and not status.progress and self.since is not None:
            text += f", for {_span(now - self.since)}"
        self.since = now if changed else self.since
        self.last, self.last_at = status, now
        self.mark = (tally.groups, tally.trajectories, tally.tokens)
        return text

    def _rates(self, tally: Tally, seconds: float) -> str:
        groups, trajectories, tokens = (b - a for a, b in zip(self.mark, (tally.groups, tally.trajectories,
                                                                             tally.tokens), strict=True))
        seconds = max(seconds, 1e-6)
        return (f": {groups / seconds:.2f} groups/s ({trajectories / seconds:.1f} trajectories/s), "
                f"{tokens / seconds:.0f} tokens/s over the last {_span(seconds)}; {tally.groups} groups in all"
                + (f"; earned ${tally.earned_usd:.4f} (the site's ledger)" if tally.earned_usd is not None else "")
                + (f"; {tally.refused} frames refused by the site for its rate budget (sent again)" if tally.refused
                   else ""))

    def installs(self, session, job_id: int | None, now: float) -> tuple[Install, ...]:
        """The job's running installs, oldest version first, with their progress where a relay knows it."""
        keys = [key for key in session.installs.installing if key[0] == job_id]
        self.began = {key: self.began.get(key, now) for key in keys}
        found = []
        for key in sorted(keys, key=lambda k: k[1]):
            relay = session.relaying.get(key)
            found.append(Install(version=key[1], seconds=now - self.began[key],
                                 chunks=len(relay.have) if relay else None,
                                 total=len(relay.manifest.chunks) if relay and relay.manifest else None))
        return tuple(found)


def view_of(session, reporter: Reporter, now: float) -> View:
    """The facts of an :class:`~worker_agent.session.AgentSession` (read, never changed) at ``now``."""
    job = session.assignment.job_id if session.assignment else None
    engine = session.installs.engine_for(job)
    last = session.tally.last_at
    done = session.installs.last_install
    return View(connected=session.connection.ws is not None, state=session.state(), job_id=job,
                version=engine.version if engine else None, wanted=session.installs.wanted.get(job, 0) if job else 0,
                installs=reporter.installs(session, job, now), released=session.released if job is None else None,
                failure=session.rollout.failure, refused=session.rollout.refused, no_work=session.rollout.no_work,
                recent_work=last is not None and now - last < GENERATING_HOLD_S,
                last_install=f"v{done[1]} installed {done[2]:.1f} s {done[3]}" if done and done[0] == job else None)


async def report(session, *, every: float, poll: float = POLL_S, status_file: Path | None = None) -> None:
    """Log the session's status lines until cancelled (the session runs this beside its connection), and keep
    ``status_file`` (what ``echo2-agent status`` reads) up to date every ``FILE_EVERY_S``."""
    reporter = Reporter(every=every)
    written_at = None
    while True:
        now = time.monotonic()
        session.tally.refused = session.connection.refused
        view = view_of(session, reporter, now)
        text = reporter.line(view, session.tally, now)
        if text is not None:
            log.info("%s", text)
        if status_file is not None and (written_at is None or now - written_at >= FILE_EVERY_S):
            write_status(status_file, view, session.tally)
            written_at = now
        await asyncio.sleep(poll)


def write_status(path: Path, view: View, tally: Tally) -> None:
    """What the agent does now, as JSON (written whole, then renamed: a reader never sees half a file). A write that
    fails is logged at DEBUG: the status file is a convenience, never a reason to stop."""
    described = describe(view)
    data = {"at": time.time(), "pid": os.getpid(), "connected": view.connected, "state": view.state,
            "job": view.job_id, "version": view.version, "status": described.text if described else "disconnected",
            "last_install": view.last_install, "groups": tally.groups, "trajectories": tally.trajectories,
            "tokens": tally.tokens, "refused": tally.refused, "earned_usd": tally.earned_usd}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(data))
        os.replace(tmp, path)
    except OSError as err:
        log.debug("status file %s: %s", path, err)


STALE_S = 30.0  # a status file older than this belongs to an agent that stopped


def status_path(config: Path) -> Path:
    """The status file of the agent run with credentials ``config`` (``agent.json`` -> ``agent.status.json``)."""
    return config.with_name(config.stem + ".status.json")


def read_status(path: Path) -> tuple[dict, float]:
    """The status a running agent keeps in ``path`` and its age in seconds; ValueError saying why when there is none
    or it is stale."""
    try:
        data = json.loads(path.read_text())
        age = max(0.0, time.time() - float(data["at"]))
    except FileNotFoundError:
        raise ValueError(f"no status at {path}: no agent has run with this --config (echo2-agent run)") from None
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise ValueError(f"{path}: unreadable status ({err})") from None
    if age > STALE_S:
        raise ValueError(f"{path} is {age:.0f} s old: the agent (pid {data.get('pid')}) is not running; its last "
                         f"status: {data.get('status')}")
    return data, age


def status_lines(data: dict, age: float) -> list[str]:
    """What ``echo2-agent status`` prints."""
    lines = [str(data.get("status"))]
    if data.get("job") is not None:
        lines.append(f"job {data['job']}, engine at v{data.get('version')}"
                     + (f"; {data['last_install']}" if data.get("last_install") else ""))
    lines.append(f"accepted by the site: {data.get('groups', 0)} groups, {data.get('trajectories', 0)} trajectories, "
                 f"{data.get('tokens', 0)} tokens; as of {age:.0f} s ago (pid {data.get('pid')})")
    if data.get("earned_usd") is not None:
        lines.append(f"earned: ${data['earned_usd']:.4f}, what the site's ledger billed for this worker so far")
    return lines

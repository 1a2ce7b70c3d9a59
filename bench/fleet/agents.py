"""One process of the emulated fleet: many real agent sessions on one event loop, each with a stand-in engine.

Run by ``bench/bench_fleet.py``: ``python -m bench.fleet.agents SPEC.json`` where the spec names the agents
(worker id, name, agent key, site URL), the engine's speed, groups per lease, a cache directory and the base
model to put in it. The process writes ``progress`` (small, every half second) and, on SIGTERM, ``out`` (every
frame event of its sockets: :mod:`bench.fleet.probe`), then exits.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import logging
import os
import signal
import sys
from pathlib import Path


def _write(path: Path, data: dict) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data))
    os.replace(tmp, path)


def _prefill(cache, model_dir: str) -> None:
    """The job's base in the cache, as a provider that served this model before has it: the stand-in engine
    still "installs" version 0 (the session checks the digest and builds the engine from the cached directory)."""
    from dataplane import basemodel

    digest = basemodel.digest(model_dir)
    if cache.get(digest) is None:
        cache.put(digest, basemodel.pack(model_dir))


async def run(spec: dict) -> None:
    from worker_agent.cache import BaseCache
    from worker_agent.config import AgentConfig
    from worker_agent.session import AgentSession

    from .engine import StandInEngine
    from .probe import Probe, install

    agents = spec["agents"]
    probe = Probe({a["agent_key"]: a["worker_id"] for a in agents})
    install(probe)
    loop = asyncio.get_running_loop()
    # Each session generates and installs on asyncio's default executor: one thread per session, not 6 for all.
    loop.set_default_executor(concurrent.futures.ThreadPoolExecutor(max_workers=2 * len(agents) + 8))
    cache = BaseCache(spec["cache_dir"], max_bytes=1 << 30)
    if spec.get("model_dir"):
        await asyncio.to_thread(_prefill, cache, spec["model_dir"])
    tokens_per_s = float(spec["tokens_per_s"])
    sessions = [AgentSession(AgentConfig(server=a["server"], worker_id=a["worker_id"], name=a["name"],
                                         agent_key=a["agent_key"]),
                             engine_factory=lambda d: StandInEngine(d, tokens_per_s=tokens_per_s), cache=cache,
                             groups_per_lease=int(spec["groups_per_lease"]), status_every=0.0)
                for a in agents]
    stop = asyncio.Event()
    loop.add_signal_handler(signal.SIGTERM, stop.set)
    loop.add_signal_handler(signal.SIGINT, stop.set)
    progress = Path(spec["progress"])

    async def report() -> None:
        while True:
            _write(progress, probe.progress())
            await asyncio.sleep(0.5)

    tasks = [asyncio.create_task(s.run_forever(), name=f"agent {a['worker_id']}")
             for s, a in zip(sessions, agents, strict=True)]
    tasks.append(asyncio.create_task(report()))
    await stop.wait()
    for session in sessions:
        session.stopped.set()
    for task in tasks:
        task.cancel()
    await asyncio.wait(tasks, timeout=10)
    _write(Path(spec["out"]), probe.summary())


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s: %(message)s")
    logging.getLogger("websockets").setLevel(logging.ERROR)
    asyncio.run(run(spec))
    os._exit(0)  # the executor's sleeping threads (a batch being "generated") need not be waited for


if __name__ == "__main__":
    main()

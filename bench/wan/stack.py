"""The ECHO-2 stack on a WAN topology (bench/wan/netns.py): the site's namespace runs a private redis-server, daphne
over SQLite, a Celery worker and beat; the learner's and each agent's namespace its process; every node a delay
proxy (bench/wan/proxy.py) in front of its listening services. Every process is started with ``ip netns exec`` in
its own process group, logs under ``<workdir>/logs``, stopped by pid (echo2_site.demo.Stack). Where tc netem
emulates the links (``Net.emulation``), the proxies forward without delay: their taps are what the bench reads.

The site uses SQLite in the run's directory (as the fault suite does): the machine's PostgreSQL sits in the host's
namespace, which the topology never touches. The bench itself reaches the site through a Unix socket daphne also
listens on (filesystems are not namespaced), so the host needs no link into the topology.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

from echo2_site.demo import DAPHNE_WEBSOCKET_LIMITS, Stack, wait_for

from .netns import Net

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
PRICE = 0.36
SITE_PORT, REDIS_PORT, SNAPSHOT_PORT, HUB_PORT, RELAY_PORT = 8000, 6379, 8100, 8101, 8200
FINAL = ("completed", "failed", "cancelled")


@dataclass
class Job:
    """The job's settings (the fault suite's tiny arithmetic job; few steps)."""

    steps: int = 6
    staleness: int = 3
    batch: int = 16
    group: int = 4
    seed: int = 0
    hidden: int = 64  # the tiny model's width: the snapshot's size M grows as hidden**2 (64: 0.17 MB, 448: 8 MB)
    layers: int = 2
    full_every: int = 1  # every publication a full snapshot: T_bcast against M/Bw (10: deltas between fulls)
    strategy: str = "chain"  # the job's broadcast_strategy (dataplane/broadcast/strategies/: chain, star-limited...)


def site_env(directory: Path, site_address: str) -> dict[str, str]:
    import os

    return dict(os.environ, DATABASE_URL=f"sqlite:///{directory / 'site.sqlite3'}", DEBUG="true",
                REDIS_URL=f"redis://127.0.0.1:{REDIS_PORT}/0", ECHO2_DATA_DIR=str(directory),
                DJANGO_SETTINGS_MODULE="echo2_site.settings", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                TOKENIZERS_PARALLELISM="false", PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT),
                ECHO2_ALLOW_PRIVATE_PEERS="true", ALLOWED_HOSTS=f"localhost,127.0.0.1,{site_address}")


@dataclass
class WanStack:
    """Launch the stack on ``net``, run one job, read what the site recorded."""

    net: Net
    workdir: Path
    job: Job = field(default_factory=Job)
    tokens: dict[str, str] = field(default_factory=dict)
    job_id: int = 0
    workers: dict[str, int] = field(default_factory=dict)  # agent node -> its worker id at the site
    samples: list[list] = field(default_factory=list)  # polls of the summary: [t, status, step, accepted_records]
    killed: set[str] = field(default_factory=set)  # processes a fault ended on purpose (check_alive spares them)

    def __post_init__(self) -> None:
        self.workdir = self.workdir.resolve()  # paths go to processes in other directories and to the site
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.stack = Stack(self.workdir, site_env(self.workdir, self.net.address("site")))
        self.sock = self.workdir / "site.sock"

    @property
    def server(self) -> str:
        return f"http://{self.net.address('site')}:{SITE_PORT}"

    def api(self, token: str = "owner") -> httpx.Client:
        return httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), base_url="http://127.0.0.1/api/",
                            timeout=10, headers={"Authorization": f"Token {self.tokens[token]}"})

    @property
    def taps(self) -> Path:
        """The proxies' records (bench/wan/tap.py): one JSON-lines file per node."""
        return self.workdir / "taps"

    def start_proxy(self, node: str, ports: list[int], *, ws: tuple[int, ...] = (), bulk: tuple[int, ...] = ()) -> None:
        """Our delay proxy in front of ``node``'s ``ports``; its tap times the websocket requests on ``ws`` ports and
        the transfers on ``bulk`` ports. Where tc netem emulates the links (``net.emulation``), the proxy adds no
        delay, jitter or loss of its own (its links are left out of its config) and is there for the tap alone: the
        reply round trips, websocket opens and per-hop transfers every table reads."""
        address = self.net.address(node)
        self.taps.mkdir(exist_ok=True)
        delays = self.net.emulation == "proxy"  # with netem the links' delay and loss are in tc: the proxy only taps
        config = {"listen": [[address, p, "127.0.0.1", p] for p in ports],
                  "link": vars(dict(self.net.topology.nodes())[node]) if delays else {},
                  "peers": {a: vars(link) for a, link in self.net.links().items()} if delays else {},
                  "seed": len(address),
                  "tap": {"path": str(self.taps / f"{node}.jsonl"), "node": node, "ws": list(ws), "bulk": list(bulk)}}
        path = self.workdir / f"proxy-{node}.json"
        path.write_text(json.dumps(config))
        self.stack.start(f"proxy-{node}", *self.net.exec(node), str(BIN / "python"), "-m", "bench.wan.proxy",
                         str(path))

    def launch_site(self) -> None:
        """Model, Redis, migrations, users, daphne, Celery: all in the site's namespace."""
        site = self.net.exec("site")
        self.stack.run(str(BIN / "echo2-learner"), "init-model", str(self.model_dir), "--task", "arithmetic",
                       "--hidden", str(self.job.hidden), "--layers", str(self.job.layers))
        (self.workdir / "redis").mkdir(exist_ok=True)
        self.stack.start("redis", *site, "redis-server", "--port", str(REDIS_PORT), "--bind", "127.0.0.1", "--save",
                         "", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", str(self.workdir / "redis"),
                         "--auto-aof-rewrite-percentage", "0")
        self.stack.run(*site, str(BIN / "python"), "manage.py", "migrate", "--noinput")
        script = ("import json\nfrom django.contrib.auth.models import User\n"
                  "from marketplace.services import api_token_issue\n"
                  "print(json.dumps({n: api_token_issue(user=User.objects.create_user(n, password=n)) "
                  "for n in ('owner', 'provider')}))\n")
        out = self.stack.run(*site, str(BIN / "python"), "manage.py", "shell", "-c", script)
        self.tokens = json.loads(out.strip().splitlines()[-1])
        self.stack.start("daphne", *site, str(BIN / "daphne"), "-b", "127.0.0.1", "-p", str(SITE_PORT), "-u",
                         str(self.sock), *DAPHNE_WEBSOCKET_LIMITS, "echo2_site.asgi:application")
        self.stack.start("celery-worker", *site, str(BIN / "celery"), "-A", "echo2_site", "worker", "-l", "info", "-P",
                         "solo")
        self.stack.start("celery-beat", *site, str(BIN / "celery"), "-A", "echo2_site", "beat", "-l", "info", "-s",
                         str(self.workdir / "celerybeat-schedule"))
        self.start_proxy("site", [SITE_PORT, REDIS_PORT], ws=(SITE_PORT,))
        self.start_proxy("learner", [SNAPSHOT_PORT, HUB_PORT], bulk=(SNAPSHOT_PORT, HUB_PORT))
        wait_for(self.site_up, "the site", 90)

    @property
    def model_dir(self) -> Path:
        return self.workdir / "tiny-arithmetic"

    def site_up(self) -> bool:
        try:
            with httpx.Client(transport=httpx.HTTPTransport(uds=str(self.sock)), timeout=2) as client:
                return client.get("http://127.0.0.1/api/schema/").status_code == 200
        except httpx.HTTPError:
            return False

    def launch_agents(self) -> None:
        """Register each agent from its own namespace (over its link), then run it."""
        agents = [n for n, _ in self.net.topology.nodes() if n.startswith("a")]
        for node in agents:
            link, cfg = dict(self.net.topology.nodes())[node], self.workdir / "agents" / f"{node}.json"
            self.stack.run(*self.net.exec(node), str(BIN / "echo2-agent"), "register", "--server", self.server,
                           "--token", self.tokens["provider"], "--name", f"wan-{node}", "--price", str(PRICE),
                           "--bandwidth-mbps", f"{link.up_mbit:g}", "--relay-address",
                           f"{self.net.address(node)}:{RELAY_PORT}", "--config", str(cfg), "--json")
            self.workers[node] = json.loads(cfg.read_text())["worker_id"]
            self.start_proxy(node, [RELAY_PORT], bulk=(RELAY_PORT,))
            self.stack.start(f"agent-{node}", *self.net.exec(node), str(BIN / "echo2-agent"), "run", "--config",
                             str(cfg), "--threads", "1", "--relay-listen", f"127.0.0.1:{RELAY_PORT}", "--debug")
        with self.api("provider") as provider:
            wait_for(lambda: sum(w["status"] == "idle" for w in provider.get("workers/").json()["results"])
                     == len(agents), f"{len(agents)} idle workers", 180)

    def launch_job(self) -> None:
        with self.api() as api:
            job = api.post("jobs/", json={
                "name": f"wan: {self.net.topology.name}", "model_dir": str(self.model_dir),
                "task": {"name": "arithmetic", "max_operand": 4}, "staleness": self.job.staleness,
                "batch_trajectories": self.job.batch, "group_size": self.job.group, "learning_rate": 1e-3,
                "max_steps": self.job.steps, "max_new_tokens": 2, "seed": self.job.seed,
                "snapshot_full_every": self.job.full_every, "broadcast_strategy": self.job.strategy,
                "learner_uplink_bps": int(self.net.topology.learner.up_bps)})
            if job.status_code != 201:
                raise RuntimeError(f"the site refused the job ({job.status_code}): {job.text[:500]}")
            self.job_id = job.json()["id"]
            api.post(f"jobs/{self.job_id}/start/").raise_for_status()
        self.stack.start("learner", *self.net.exec("learner"), str(BIN / "echo2-learner"), "--server", self.server,
                         "--job", str(self.job_id), "--token", self.tokens["owner"], "--redis",
                         f"redis://{self.net.address('site')}:{REDIS_PORT}/0", "--snapshot-dir",
                         str(self.workdir / "snapshots"), "--snapshot-host", "127.0.0.1", "--snapshot-port",
                         str(SNAPSHOT_PORT), "--relay-port", str(HUB_PORT), "--advertise-host",
                         self.net.address("learner"))

    def wait(self, timeout: float) -> str:
        """Until the job ends (its status) or ``timeout`` seconds pass ('timeout'); each poll kept in ``samples``."""
        deadline = time.monotonic() + timeout
        with self.api() as api:
            while time.monotonic() < deadline:
                self.check_alive()
                summary = api.get(f"jobs/{self.job_id}/summary/").json()
                counters = summary.get("counters") or {}
                self.samples.append([time.time(), summary["status"], summary["step"],
                                     int(counters.get("accepted_records", 0))])
                if summary["status"] in FINAL:
                    return summary["status"]
                time.sleep(1)
        return "timeout"

    def check_alive(self) -> None:
        """Every process still running, but those a fault ended (``killed``)."""
        for name, proc in self.stack.procs:
            if name != "learner" and name not in self.killed and proc.poll() is not None:
                raise RuntimeError(f"{name} exited with code {proc.returncode}; see {self.stack.logs / name}.log")

    def kill_agent(self, node: str) -> None:
        """A relay gone at once (SIGKILL to the agent's process group): its sockets close, as a crashed machine's
        would not; the site hears its websocket close, its children their parent's."""
        name = f"agent-{node}"
        proc = next(p for n, p in self.stack.procs if n == name)
        self.killed.add(name)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)

    def link(self, node: str, up: bool) -> None:
        """Take ``node``'s link down (a partition: nothing crosses it either way, the connections stay open and
        silent, a connect from inside fails with 'network unreachable') or bring it back (tbf stays on it)."""
        self.net.set_link(node, up)

    def results(self) -> dict:
        """What the site recorded: summary, step metrics, snapshots (with t_bcast and sizes)."""
        with self.api() as api:
            return {"summary": api.get(f"jobs/{self.job_id}/summary/").raise_for_status().json(),
                    "metrics": api.get(f"jobs/{self.job_id}/metrics/").raise_for_status().json(),
                    "snapshots": api.get(f"jobs/{self.job_id}/snapshots/").raise_for_status().json()}

    def stop(self) -> None:
        self.stack.stop()

"""``echo2-agent``: offer a GPU machine to an ECHO-2 marketplace.

\b
Examples:
  echo2-agent register --server https://echo2.example --token-file ~/.echo2-token --name rig-1 --price 0.35
  echo2-agent run --cache-dir /data/echo2-cache --cache-gb 40
  echo2-agent status                     # what the running agent is doing
  echo2-agent bench --model /models/qwen3-8b --task '{"name": "math"}' --report
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Annotated

import typer

from dataplane.tokens import read_token_file

from .config import AgentConfig, ConfigError, default_path

app = typer.Typer(add_completion=False, no_args_is_help=True, help=__doc__, rich_markup_mode=None)

ConfigOpt = Annotated[
    Path | None, typer.Option("--config", help="Credentials file (default ~/.config/echo2/agent.json).")
]


AllowUserCodeOpt = Annotated[bool, typer.Option(
    "--allow-user-code", help="Run job owners' code in this process (reward functions 'pkg.module:fn', verifiers "
    "environments): arbitrary code on this machine, see docs/trust.md 'User code on workers'. Declared to the site, "
    "which assigns such jobs only to workers that opted in; off, the agent also refuses any it is given.")]
RelayListenOpt = Annotated[str | None, typer.Option(
    help="HOST:PORT to serve snapshot chunks to a chain child (default: 0.0.0.0 and the port of the registered "
    "--relay-address, if any; 'none': tail only).")]
EngineOpt = Annotated[str, typer.Option(help="Generation engine: auto (vllm on a GPU with vLLM, else hf), hf, vllm.")]


def _fail(message: str) -> None:
    typer.echo(f"echo2-agent: error: {message}", err=True)
    raise typer.Exit(1)


@app.command()
def register(
    ctx: typer.Context,
    server: Annotated[str, typer.Option(help="Site URL, e.g. http://127.0.0.1:8000.")],
    price: Annotated[float, typer.Option(help="Price c_i in USD per hour (> 0).")],
    name: Annotated[str | None, typer.Option(help="Machine name, unique among yours (default: hostname).")] = None,
    gpu: Annotated[str, typer.Option(help="GPU model, e.g. 'RTX 5090' (default: detected).")] = "",
    bandwidth_mbps: Annotated[float, typer.Option(help="Link bandwidth B_w in Mbit/s.")] = 100.0,
    relay_address: Annotated[str, typer.Option(help="host:port where chain peers reach this machine.")] = "",
    token_file: Annotated[Path | None, typer.Option(envvar="ECHO2_TOKEN_FILE", help="A file holding your provider "
                                                    "API token (first line); keep it mode 600.")] = None,
    token: Annotated[str | None, typer.Option(envvar="ECHO2_TOKEN", help="Your provider API token. Prefer "
                                              "--token-file or ECHO2_TOKEN: a --token shows in `ps`.")] = None,
    config: ConfigOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Register this machine with the site and store its agent key (file mode 0600)."""
    import socket

    import httpx

    token = _api_token(ctx, token=token, token_file=token_file)

    if price <= 0:
        _fail("--price must be > 0 USD per hour")
    if bandwidth_mbps <= 0:
        _fail("--bandwidth-mbps must be > 0")
    from .hardware import probe

    hardware = probe()
    detected = hardware.gpus[0].name if hardware.gpus else "cpu"
    body = {"name": name or socket.gethostname(), "gpu": gpu or detected, "price_per_hour": f"{price:.4f}",
            "bandwidth_bps": int(bandwidth_mbps * 1e6 / 8), "relay_address": relay_address,
            "hardware": hardware.model_dump()}
    try:
        response = httpx.post(server.rstrip("/") + "/api/workers/", json=body, timeout=30,
                              headers={"Authorization": f"Token {token}"})
    except httpx.HTTPError as err:
        _fail(f"cannot reach {server}: {err}")
    if response.status_code >= 400:
        _fail(f"registration refused ({response.status_code}): {_reason(response)}")
    data = response.json()
    path = config or default_path()
    AgentConfig(server=server, worker_id=data["id"], name=data["name"], agent_key=data["agent_key"],
                relay_address=relay_address, bandwidth_bps=body["bandwidth_bps"]).save(path)
    if json_output:
        typer.echo(json.dumps({"worker_id": data["id"], "name": data["name"], "config": str(path)}))
    else:
        typer.echo(f"registered worker {data['id']} ({data['name']}, ${price:.2f}/h); credentials in {path}")


@app.command()
def run(
    config: ConfigOpt = None,
    device: Annotated[str | None, typer.Option(help="torch device (default: cuda if present, else cpu).")] = None,
    engine: EngineOpt = "auto",
    groups: Annotated[int, typer.Option(min=1, max=64, help="Prompt groups to lease at a time.")] = 2,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch.")] = None,
    seed: Annotated[int | None, typer.Option(help="Sampling seed (default: random).")] = None,
    relay_listen: RelayListenOpt = None,
    cache_dir: Annotated[Path | None, typer.Option(envvar="ECHO2_CACHE_DIR", help="Where jobs' base models are "
                                                   "kept, by digest (default ~/.cache/echo2/base-snapshots).")] = None,
    cache_gb: Annotated[float, typer.Option(min=0, help="Disk for cached base models, GB; the least recently used "
                                            "are evicted beyond it (the one in use is always kept).")] = 4.0,
    status_every: Annotated[float, typer.Option(min=0, help="Seconds between two summaries of what the agent is "
                                                "doing (each change at once, never two within 2 s); 0: changes "
                                                "only.")] = 10.0,
    allow_user_code: AllowUserCodeOpt = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="Warnings and errors only.")] = False,
    debug: Annotated[bool, typer.Option(help="Verbose logs and full tracebacks.")] = False,
) -> None:
    """Connect to the site and generate rollouts whenever the scheduler activates this machine. No model files are
    needed here: each job's base model comes from its learner (snapshot version 0), cached under --cache-dir.

    It says what it does in one line every --status-every seconds (--debug: details); see `echo2-agent status`."""
    import asyncio

    logging.basicConfig(level=logging.DEBUG if debug else logging.WARNING if quiet else logging.INFO,
                        format="%(asctime)s agent: %(message)s", datefmt="%H:%M:%S")
    logging.getLogger("websockets").setLevel(logging.WARNING)
    logging.getLogger("httpx").setLevel(logging.WARNING)
    try:
        cfg = AgentConfig.load(config or default_path())
    except ConfigError as err:
        _fail(str(err))
    _opt_in(cfg, allow_user_code)
    import torch

    from .cache import BaseCache, default_cache_dir
    from .connection import AgentRejected
    from .engines import make_engine
    from .session import AgentSession

    chosen, options = _engine_choice(engine, device=device, seed=seed)
    if threads:
        torch.set_num_threads(threads)
    try:
        cache = BaseCache(cache_dir or default_cache_dir(), max_bytes=int(cache_gb * 1e9))
    except OSError as err:
        _fail(f"--cache-dir: {err}")
    warming = _warm_in_background(chosen, cache)
    session = AgentSession(cfg, engine_factory=_after(warming, lambda d: make_engine(chosen, d, **options)),
                           cache=cache, groups_per_lease=groups,
                           relay_listen=_relay_listen(relay_listen, cfg), status_every=status_every,
                           status_file=_status_file(config))
    try:
        asyncio.run(session.run_forever())
    except AgentRejected as err:
        _fail(f"the site refused this agent: {err}; register again")
    except KeyboardInterrupt:
        typer.echo("stopped", err=True)


def _status_file(config: Path | None) -> Path:
    from .status import status_path

    return status_path(config or default_path())


@app.command("status")
def status_command(
    config: ConfigOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the status file as JSON.")] = False,
) -> None:
    """What the agent running with this --config is doing now (state, job, version, last install, groups accepted),
    from the status file it rewrites every 2 s beside its credentials. Exit 1 when none is running."""
    from .status import read_status, status_lines

    try:
        data, age = read_status(_status_file(config))
    except ValueError as err:
        _fail(str(err))
    typer.echo(json.dumps(data) if json_output else "\n".join(status_lines(data, age)))


def _opt_in(cfg: AgentConfig, allow_user_code: bool) -> None:
    """The provider's opt-in to run job owners' code: the flag, or the config file's ``allow_user_code``; kept on the
    config (the session hands it to every task it prepares) and, for code that asks the process, in the environment
    (``ECHO2_ALLOW_USER_CODE=1``, dataplane/tasks/verifiers_env.py)."""
    cfg.allow_user_code = cfg.allow_user_code or allow_user_code
    if cfg.allow_user_code:
        os.environ["ECHO2_ALLOW_USER_CODE"] = "1"
        logging.getLogger("echo2.agent").warning("running job owners' code in this process (--allow-user-code): "
                                                 "their reward functions can do anything this user can")


def _after(thread, build):
    """``build`` once ``thread`` (the warm-up) is done: transformers' lazy imports are not thread-safe."""
    def built(model_dir: str):
        thread.join()
        return build(model_dir)
    return built


def _relay_listen(value: str | None, cfg: AgentConfig) -> str | None:
    """--relay-listen resolved: default 0.0.0.0 and the registered relay address' port; 'none': tail only."""
    if value is None and cfg.relay_address:
        value = "0.0.0.0:" + cfg.relay_address.rpartition(":")[2]
    if value == "none":
        return None
    if value is not None and not value.rpartition(":")[2].isdigit():
        _fail(f"--relay-listen: expected HOST:PORT, got {value!r}")
    return value


def _warm_in_background(engine: str, cache):
    """Import the engine's modules while the agent connects, in a thread (started, returned: join it before
    building an engine)."""
    import threading

    from .engines import warm_imports

    entries = cache.entries()
    recent = str(entries[-1].path) if entries else None  # the base model used last, likely the next job's
    thread = threading.Thread(target=lambda: logging.getLogger(__name__).debug(
        "engine modules imported in %.1fs", warm_imports(engine, recent)), name="warm-imports", daemon=True)
    thread.start()
    return thread


@app.command()
def bench(
    model: Annotated[str | None, typer.Option(help="Checkpoint directory (Hugging Face layout) to benchmark; default: "
                                              "a tiny model made for the task (checks that generation works).")] = None,
    task: Annotated[str, typer.Option(help='Task spec as JSON, or just its name.')] = '{"name": "arithmetic"}',
    seconds: Annotated[float, typer.Option(min=0.1, help="How long to generate.")] = 10.0,
    group_size: Annotated[int, typer.Option(min=1, help="Samples per prompt (the job's n).")] = 8,
    groups: Annotated[int, typer.Option(min=1, help="Prompt groups per batch.")] = 2,
    max_new_tokens: Annotated[int, typer.Option(min=1, help="Longest completion.")] = 8,
    engine: EngineOpt = "auto",
    device: Annotated[str | None, typer.Option(help="torch device for the hf engine (default: cuda if present, "
                                               "else cpu).")] = None,
    threads: Annotated[int | None, typer.Option(min=1, help="CPU threads for torch.")] = None,
    report: Annotated[bool, typer.Option(help="Send the figure to the site as this worker's calibration.")] = False,
    config: ConfigOpt = None,
    json_output: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Measure mu_i (trajectories/s) for a model and task with the engine `run` would use; --report tells the
    scheduler."""
    from dataplane.tasks import TaskSpecError, build_task

    try:
        spec = json.loads(task) if task.lstrip().startswith("{") else {"name": task}
        adapter = build_task(spec)
    except (ValueError, TaskSpecError) as err:
        _fail(f"--task: {err}")
    model = _bench_model(model, adapter.spec()["name"], report=report)
    cfg = None
    if report:
        try:
            cfg = AgentConfig.load(config or default_path())
        except ConfigError as err:
            _fail(str(err))
    import torch
    from rich.progress import Progress

    from .bench import measure_throughput
    from .engines.base import SamplingParams

    if threads:
        torch.set_num_threads(threads)
    chosen, built = _bench_engine(engine, model, device=device)
    where = f"{chosen} on {getattr(built, 'device', 'cuda')}"
    params = SamplingParams(max_new_tokens=max_new_tokens)
    with Progress(transient=True, disable=json_output) as progress:
        bar = progress.add_task(f"generating ({where})", total=seconds)
        result = measure_throughput(built, adapter, seconds=seconds, groups=groups, group_size=group_size,
                                    params=params, on_progress=lambda done: progress.update(bar, completed=done))
    out = {"model": model, "engine": chosen, "task": adapter.spec(), "trajectories": result.trajectories,
           "seconds": result.seconds,
           "throughput": result.throughput, "tokens_per_s": result.tokens_per_s}
    if cfg is not None:
        _report_calibration(cfg, model, adapter.spec(), result)
        out["reported"] = True
    if json_output:
        typer.echo(json.dumps(out))
    else:
        typer.echo(f"mu = {result.throughput:.2f} trajectories/s ({result.tokens_per_s:.0f} tokens/s, "
                   f"{result.trajectories} trajectories in {result.seconds:.1f}s, {where})"
                   + ("; reported to the site" if cfg else ""))


def _bench_model(model: str | None, task_name: str, *, report: bool) -> str:
    """What ``bench`` measures: ``--model``, else a tiny model for the task that ``echo2-learner init-model`` makes in
    a temporary directory (removed at exit): providers hold no model, a job's base reaches them from its learner.
    A calibration (``--report``) is of one model, the job's, so it needs ``--model``."""
    if model is not None:
        if not Path(model).is_dir():
            _fail(f"--model: {model} is not a directory")
        return model
    if report:
        _fail("--report needs --model: a calibration is of one model, the base of the jobs it is for")
    import atexit
    import shutil
    import subprocess
    import sys
    import tempfile

    work = Path(tempfile.mkdtemp(prefix="echo2-bench-"))
    atexit.register(shutil.rmtree, work, ignore_errors=True)
    made = subprocess.run([str(Path(sys.executable).with_name("echo2-learner")), "init-model", str(work / "tiny"),
                           "--task", task_name], capture_output=True, text=True, timeout=600)
    if made.returncode != 0:
        _fail(f"cannot make a tiny model for task {task_name!r}: {(made.stderr.strip() or 'no reason given')[-300:]}")
    return str(work / "tiny")


def _engine_choice(engine: str, *, device: str | None, seed: int | None) -> tuple[str, dict]:
    """The engine `run` and `bench` build (auto: vllm on a GPU with vLLM, else hf) and its constructor options."""
    from .engines import ENGINES, default_engine

    if engine not in (*ENGINES, "auto"):
        _fail(f"--engine: unknown engine {engine!r}; use auto, {', '.join(ENGINES)}")
    chosen = default_engine() if engine == "auto" else engine
    return chosen, {"seed": seed} | ({"device": device} if chosen == "hf" else {})


def _bench_engine(engine: str, model: str, *, device: str | None):
    """The engine `run` would pick, loaded with ``model`` (seed 0); a clear error where it cannot run."""
    from .engines import make_engine

    chosen, options = _engine_choice(engine, device=device, seed=0)
    try:
        return chosen, make_engine(chosen, model, **options)
    except RuntimeError as err:  # vLLM missing or unusable here
        _fail(f"--engine {chosen}: {err}")


def _report_calibration(cfg: AgentConfig, model: str, task: dict, result) -> None:
    """Send a measured throughput to the site as this worker's calibration for (model, task)."""
    import httpx

    try:
        response = httpx.post(f"{cfg.server.rstrip('/')}/api/workers/{cfg.worker_id}/calibrations/", timeout=30,
                              headers={"Authorization": f"Bearer {cfg.agent_key}"},
                              json={"model_dir": model, "task": task, "throughput": result.throughput,
                                    "tokens_per_s": result.tokens_per_s})
    except httpx.HTTPError as err:
        _fail(f"cannot reach {cfg.server}: {err}")
    if response.status_code >= 400:
        _fail(f"calibration refused ({response.status_code}): {_reason(response)}")


def _api_token(ctx: typer.Context, *, token: str | None, token_file: Path | None) -> str:
    """The provider's API token: from --token-file (ECHO2_TOKEN_FILE), else ECHO2_TOKEN or --token, which works
    but is warned about (other users see command lines in `ps`, shells keep them in history)."""
    if token_file is not None:
        try:
            return read_token_file(token_file)
        except ValueError as err:
            _fail(str(err))
    if not token:
        _fail("no API token: give --token-file PATH (or ECHO2_TOKEN_FILE), or ECHO2_TOKEN")
    source = ctx.get_parameter_source("token")
    if source is not None and source.name == "COMMANDLINE":
        typer.echo("echo2-agent: warning: --token on the command line shows in `ps` and shell history; "
                   "use --token-file PATH or ECHO2_TOKEN", err=True)
    return token


def _reason(response) -> str:
    try:
        return response.json().get("detail", response.text)
    except ValueError:
        return response.text[:200]


def main() -> None:
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    app()
